"""Audit events for logins, from Django's auth signals: one place for the portal, the API
and the admin console, and for attempts that fail or are locked out."""

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver

from controlplane import audit
from controlplane.choices import AuditOutcome


def _context(request):
    if request is None:
        return {}
    return {
        "ip_address": audit.client_ip(request),
        "source": audit.source_for_path(request.path),
    }


@receiver(user_logged_in)
def login_succeeded(sender, request, user, **kwargs):
    with audit.audit_context(actor=user, **_context(request)):
        audit.record("auth.login", user)


@receiver(user_logged_out)
def logged_out(sender, request, user, **kwargs):
    if user is not None:
        with audit.audit_context(actor=user, **_context(request)):
            audit.record("auth.logout", user)


@receiver(user_login_failed)
def login_failed(sender, credentials, request=None, **kwargs):
    username = str(credentials.get("username", ""))[:150]
    with audit.audit_context(actor=None, **_context(request)):
        audit.record(
            "auth.login",
            object_type="tenants.user",
            object_repr=username,
            outcome=AuditOutcome.DENIED,
            detail={"username": username},
        )
