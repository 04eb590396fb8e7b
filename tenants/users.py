"""Operators' side of users: deactivate (every session and token stops at once) and
reactivate. Creating users is ``tenants.services.user_create``; identities are
``tenants.identities``."""

from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone

from controlplane import audit
from tenants.models import ApiToken, User


def _end_sessions(user: User) -> int:
    """Delete the user's sessions. (Inactive users are refused by the auth backend on their
    next request anyway; this also drops the rows.)"""
    ended = 0
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        if str(session.get_decoded().get("_auth_user_id")) == str(user.pk):
            session.delete()
            ended += 1
    return ended


@transaction.atomic
def user_deactivate(*, user: User, reason: str = "") -> User:
    """Lock a user out: not active, sessions ended, API tokens revoked. Memberships and
    everything their projects own stay."""
    user = User.objects.select_for_update().get(pk=user.pk)
    now = timezone.now()
    revoked = ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(revoked_at=now)
    sessions = _end_sessions(user)
    if user.is_active:
        user.is_active = False
        user.save(update_fields=["is_active"])
    audit.record(
        "user.deactivate",
        user,
        detail={"reason": reason, "tokens_revoked": revoked, "sessions_ended": sessions},
    )
    return user


@transaction.atomic
def user_reactivate(*, user: User) -> User:
    """Let a user in again. Their old tokens stay revoked: they make new ones."""
    user = User.objects.select_for_update().get(pk=user.pk)
    if not user.is_active:
        user.is_active = True
        user.save(update_fields=["is_active"])
        audit.record("user.reactivate", user)
    return user
