"""What the SDK raises. Every exception is a ``KumoError``.

An answer carrying Kumo's error body ``{status, code, message, details}`` becomes an
``ApiError`` subclass chosen by its ``code`` first (``quota_exceeded``, ``invalid_state``, ...)
and by its HTTP status otherwise, so ``except Conflict`` also catches ``QuotaExceeded``. An
error answer without that body (a proxy's 502 page) maps by status alone, with the text as
the message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from kumo_sdk.types import Operation


class KumoError(Exception):
    """Base of everything the SDK raises."""


class NotSupported(KumoError):
    """The API offers no such verb for this resource (raised before any request)."""


class ConnectionFailed(KumoError):
    """The server could not be reached, or the connection broke, on every try."""


class ApiError(KumoError):
    """The server answered an error. ``code`` is stable for programs to branch on,
    ``message`` is a sentence for people, ``details`` maps a field name to its reasons."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    def __str__(self) -> str:
        return f"{self.message} ({self.status} {self.code})"


class InvalidInput(ApiError):
    """400: the request is malformed or breaks a rule."""

    @property
    def fields(self) -> list[str]:
        """The names of the fields at fault (``non_field_errors`` for the request as a whole)."""
        return list(self.details)


class AuthenticationFailed(ApiError):
    """401: no credential, or a bad, expired or revoked token; also a login with a wrong
    username or password."""


class PermissionDenied(ApiError):
    """403: the caller's role is too low, or the endpoint is for operators."""


class NotFound(ApiError):
    """404: no such object, or one in a project the caller holds no role in."""


class Conflict(ApiError):
    """409: the object's current state forbids the request; ``details`` says the state."""


class QuotaExceeded(Conflict):
    """409 ``quota_exceeded``: the project's quota has no room for the request."""


class InvalidState(Conflict):
    """409 ``invalid_state``: the VM's state does not allow the action
    (``details["state"]`` names it)."""


class NoCapacity(Conflict):
    """409 ``no_capacity``: nothing fits now and the request asked not to wait."""


class IdempotencyKeyReused(ApiError):
    """422: the Idempotency-Key was already used for a different request."""


class Throttled(ApiError):
    """429: too many attempts (failed logins); try again later."""


class ServerError(ApiError):
    """5xx: the server failed (still failing after the retries, for 502, 503 and 504)."""


class OperationFailed(KumoError):
    """An operation finished in ``failed``; ``operation`` holds its error code and message."""

    def __init__(self, operation: Operation) -> None:
        super().__init__(
            f"operation {operation.kind} {operation.id} failed: "
            f"{operation.error_message or operation.error_code or 'no reason given'}"
        )
        self.operation = operation


class OperationTimeout(KumoError):
    """An operation was still unfinished when the wait's time ran out; ``operation`` is the
    last state read. The work goes on on the server: waiting again is safe."""

    def __init__(self, operation: Operation, timeout: float) -> None:
        super().__init__(
            f"operation {operation.kind} {operation.id} still {operation.state} after {timeout:g} s"
        )
        self.operation = operation


_BY_CODE: dict[str, type[ApiError]] = {
    "quota_exceeded": QuotaExceeded,
    "invalid_state": InvalidState,
    "no_capacity": NoCapacity,
    "invalid_credentials": AuthenticationFailed,
    "idempotency_key_reused": IdempotencyKeyReused,
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidInput,
    401: AuthenticationFailed,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    422: IdempotencyKeyReused,
    429: Throttled,
}


def error_class(status: int, code: str) -> type[ApiError]:
    if code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else ApiError


def from_response(response: httpx.Response) -> ApiError:
    """The exception for an error answer."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        code, message = body["code"], str(body.get("message") or response.reason_phrase)
        details = body.get("details") if isinstance(body.get("details"), dict) else {}
    else:
        code = {404: "not_found"}.get(status, f"http_{status}")
        message = response.text.strip()[:200] or response.reason_phrase
        details = {}
    return error_class(status, code)(status, code, message, details)
