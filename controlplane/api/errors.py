"""One error format for the whole API.

Every error answers ``{"status": 409, "code": "conflict", "message": "…", "details": {…}}``:
``code`` is stable for programs, ``message`` is a sentence for people, ``details`` maps a
field name to its reasons (``non_field_errors`` for the request as a whole).
"""

import logging
import sys

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError, connections
from django.http import Http404, HttpResponse, JsonResponse
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import KumoError

log = logging.getLogger(__name__)


def error_body(status_code: int, code: str, message: str, details=None) -> dict:
    return {"status": status_code, "code": code, "message": message, "details": details or {}}


def _first_reason(details) -> str | None:
    """The first reason in a DRF error structure, prefixed with its field path."""
    if isinstance(details, dict):
        for field, value in details.items():
            reason = _first_reason(value)
            if reason is not None:
                return reason if field in ("non_field_errors",) else f"{field}: {reason}"
    elif isinstance(details, list):
        for index, value in enumerate(details):
            reason = _first_reason(value)
            if reason is not None:
                return reason if not isinstance(value, dict) else f"[{index}].{reason}"
    elif details is not None:
        return str(details)
    return None


def _codes(details):
    if isinstance(details, dict):
        return {k: _codes(v) for k, v in details.items()}
    if isinstance(details, list):
        return [_codes(v) for v in details]
    return str(details)


# How long a client should wait before retrying a request the database could not serve.
DATABASE_RETRY_AFTER_S = 5
# PostgreSQL's "connection exception" class and the shutdown/termination of a backend
# (``pg_terminate_backend`` answers 57P01).
_LOST_SQLSTATES = ("08", "57P01", "57P02", "57P03")


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the database connection failing (cut, terminated, refused), not a
    bug: nothing of the request was committed, and the same request may be sent again
    (with the same Idempotency-Key for a create)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    if sqlstate.startswith(_LOST_SQLSTATES):
        return True
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is not None and getattr(raw, "closed", False):
            return True
    return False


def _unavailable_body() -> dict:
    return error_body(
        503,
        "database_unavailable",
        "The service lost its database connection; nothing was changed. Try again shortly.",
    )


def exception_handler(exc, context):
    """DRF's exception handler, in Kumo's format, and a failed write is audited. A lost
    database connection is a 503 with ``Retry-After`` (and nothing to audit it with)."""
    if database_unavailable(exc):
        log.warning("database unavailable: %s", exc)
        set_rollback()
        return Response(
            _unavailable_body(),
            status=503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )
    if isinstance(exc, KumoError):
        body = error_body(exc.status, exc.code, exc.message, exc.details)
    elif isinstance(exc, DjangoValidationError):
        details = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        body = error_body(400, "invalid", _first_reason(details) or "Invalid input.", details)
    elif isinstance(exc, Http404):
        body = error_body(404, "not_found", "Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        body = error_body(403, "permission_denied", "You do not have permission to do this.")
    elif isinstance(exc, exceptions.ValidationError):
        details = _codes(exc.detail)
        if not isinstance(details, dict):
            details = {"non_field_errors": details if isinstance(details, list) else [details]}
        body = error_body(400, "invalid", _first_reason(details) or "Invalid input.", details)
    elif isinstance(exc, exceptions.APIException):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        message = exc.detail if isinstance(exc.detail, str) else str(exc.default_detail)
        body = error_body(exc.status_code, code, str(message))
    else:
        return None  # a bug: Django answers 500 (and the test suite fails)

    headers = {}
    if isinstance(exc, exceptions.APIException):
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
    if body["status"] == 401 and "WWW-Authenticate" not in headers:
        headers["WWW-Authenticate"] = 'Bearer realm="api"'
    set_rollback()
    _audit_failed_write(context, body)
    return Response(body, status=body["status"], headers=headers)


def _audit_failed_write(context, body) -> None:
    """Record a refused write by a known user (a 401 has no one to name)."""
    view = context.get("view")
    request = context.get("request")
    if request is None or request.method in ("GET", "HEAD", "OPTIONS"):
        return
    user = getattr(request, "_user", None)
    if not getattr(user, "is_authenticated", False) or body["status"] == 401:
        return
    outcome = AuditOutcome.DENIED if body["status"] in (403, 404) else AuditOutcome.FAILED
    if hasattr(view, "audit_refusal"):
        target = view.audit_refusal()
    else:
        target = {"action": f"{request.method} {request.path}"}
    try:
        # Outside the request's (rolled back) transaction: the refusal itself is kept.
        audit.record(
            target.pop("action"),
            outcome=outcome,
            detail={"status": body["status"], "code": body["code"], "message": body["message"]},
            **target,
        )
    except Exception:  # the audit of a refusal must never turn a 4xx into a 500
        log.exception("could not audit a refused %s %s", request.method, request.path)


class ErrorSerializer(serializers.Serializer):
    """The error body, for the OpenAPI schema."""

    status = serializers.IntegerField()
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField()


def login_locked_out(request, credentials, *args, **kwargs):
    """django-axes' answer to a locked-out login: 429, in Kumo's format for the API and as a
    page for the portal."""
    if not request.path.startswith("/api/"):
        from django.shortcuts import render

        return render(request, "portal/locked_out.html", status=429)
    return JsonResponse(
        error_body(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "login_locked_out",
            "Too many failed logins for this user from this address; try again later.",
        ),
        status=429,
    )


def json_404(request, exception=None):
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(404, "not_found", "Not found."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def json_500(request):
    """Django's answer to an uncaught exception (in a view or a middleware, e.g. the session
    or the login lookup): a lost database connection is a 503 with ``Retry-After``, for the
    portal as for the API; anything else is a 500."""
    if database_unavailable(sys.exc_info()[1]):
        headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)}
        if request.path.startswith("/api/"):
            return JsonResponse(_unavailable_body(), status=503, headers=headers)
        return HttpResponse(
            "Kumo lost its database connection; nothing was changed. Try again shortly.",
            status=503,
            content_type="text/plain",
            headers=headers,
        )
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(500, "server_error", "Internal error."), status=500)
    from django.views.defaults import server_error

    return server_error(request)


class RefuseTraceMiddleware:
    """TRACE (and CONNECT) are served nowhere in Kumo: 405 for every path, before any
    routing, authentication or project lookup could answer something else (a 404 for an
    unknown project, a 200 from a plain Django view). TRACE would echo the request,
    credentials included, to whoever can make a browser send it."""

    REFUSED = ("TRACE", "CONNECT")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method.upper() not in self.REFUSED:
            return self.get_response(request)
        body = error_body(405, "method_not_allowed", f"Method {request.method} not allowed.")
        response = JsonResponse(body, status=405)
        response["Allow"] = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
        return response
