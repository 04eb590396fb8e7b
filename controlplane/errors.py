"""Errors the services raise. They know nothing of HTTP; the API and the portal map them.

Each carries a stable ``code`` (clients branch on it), a sentence for people, and, for
input errors, ``details``: field name to list of reasons.
"""


class KumoError(Exception):
    status = 400
    code = "error"

    def __init__(self, message: str, *, code: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.details = details or {}


class InvalidInput(KumoError):
    """The request is malformed or breaks a rule; ``details`` names the fields."""

    status = 400
    code = "invalid"

    @classmethod
    def field(cls, name: str, reason: str) -> "InvalidInput":
        return cls(f"{name}: {reason}", details={name: [reason]})


class PermissionDenied(KumoError):
    status = 403
    code = "permission_denied"


class NotFound(KumoError):
    status = 404
    code = "not_found"


class Conflict(KumoError):
    """The object's current state forbids the action (409); ``details`` says the state."""

    status = 409
    code = "conflict"


class QuotaExceeded(Conflict):
    code = "quota_exceeded"


class HostUnavailable(KumoError):
    """A host could not answer what was asked of it (502)."""

    status = 502
    code = "host_error"
