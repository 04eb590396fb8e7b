"""One error format for the whole API.

Every error answers ``{"status": 409, "code": "conflict", "message": "…", "details": {…}}``:
``code`` is stable for programs, ``message`` is a sentence for people, ``details`` maps a
field name to its reasons (``non_field_errors`` for the request as a whole).
"""

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
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


def exception_handler(exc, context):
    """DRF's exception handler, in Kumo's format, and a failed write is audited."""
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
    if request.path.startswith("/api/"):
        return JsonResponse(error_body(500, "server_error", "Internal error."), status=500)
    from django.views.defaults import server_error

    return server_error(request)
