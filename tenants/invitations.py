"""Invitations: how a project admin brings a person in without learning who exists.

``invitation_create`` answers the same whatever the address: it never looks up users, and
the e-mail with the link goes out after commit. The invitee logs in by any method and
accepts; only then are they a member. An invitation expires after
``KUMO_INVITATION_DAYS`` and can be revoked. Accepting needs the invited address to be the
accepting user's own (compared case-insensitively) unless the operator allows any address
(``KUMO_INVITATION_ANY_ADDRESS``).
"""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from controlplane import audit, events
from controlplane.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from tenants.choices import Role
from tenants.models import Invitation, Membership, Project, User
from tenants.services import _may_grant


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def accept_url(secret: str) -> str:
    return settings.KUMO_BASE_URL.rstrip("/") + reverse("portal:invitation", args=[secret])


@transaction.atomic
def invitation_create(
    *, project: Project, email: str, role: str = Role.MEMBER, actor: User | None = None
) -> tuple[Invitation, str]:
    """Invite ``email``; returns the invitation and its secret (which only the e-mail carries
    to the invitee; the API never returns it)."""
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise InvalidInput.field("email", "not an e-mail address") from None
    if role not in Role.values:
        raise InvalidInput.field("role", f"must be one of {', '.join(Role.values)}")
    _may_grant(actor, project, role)
    secret = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        project=project,
        email=email,
        role=role,
        digest=_digest(secret),
        invited_by=actor,
        expires_at=timezone.now() + timedelta(days=settings.INVITATION_DAYS),
    )
    audit.record("invitation.create", invitation, project=project, detail={"role": role})
    link = accept_url(secret)
    inviter = actor.get_username() if actor else "An operator"

    def mail():
        send_mail(
            subject=f"[Kumo] You are invited to the project {project.name}",
            message=(
                f"{inviter} invites you to join the project {project.name} ({project.slug}) "
                f"as {role} on Kumo.\n\nLog in and accept: {link}\n\n"
                f"The invitation expires on {invitation.expires_at:%Y-%m-%d %H:%M} UTC."
            ),
            from_email=settings.DEFAULT_FROM_EMAIL,
            recipient_list=[email],
            fail_silently=True,
        )

    transaction.on_commit(mail, robust=True)
    return invitation, secret


def invitation_status(invitation: Invitation) -> str:
    if invitation.status == Invitation.Status.PENDING and invitation.expires_at <= timezone.now():
        return "expired"
    return invitation.status


@transaction.atomic
def invitation_revoke(*, invitation: Invitation) -> Invitation:
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if invitation.status != Invitation.Status.PENDING:
        raise Conflict(
            f"the invitation is {invitation.status}", details={"status": [invitation.status]}
        )
    invitation.status, invitation.revoked_at = Invitation.Status.REVOKED, timezone.now()
    invitation.save(update_fields=["status", "revoked_at"])
    audit.record("invitation.revoke", invitation, project=invitation.project)
    return invitation


def invitation_for(secret: str) -> Invitation:
    invitation = (
        Invitation.objects.select_related("project").filter(digest=_digest(secret or "")).first()
    )
    if invitation is None:
        raise NotFound("no such invitation")
    return invitation


@transaction.atomic
def invitation_accept(*, secret: str, user: User) -> Membership:
    """Make ``user`` a member as the invitation says. Refused (409) when expired, revoked or
    used; refused (403) when sent to another address, unless the operator allows it (the
    API's error handler audits the refusal)."""
    invitation = invitation_for(secret)
    invitation = (
        Invitation.objects.select_for_update().select_related("project").get(pk=invitation.pk)
    )
    status = invitation_status(invitation)
    if status != Invitation.Status.PENDING:
        raise Conflict(f"this invitation is {status}", code=f"invitation_{status}")
    if (user.email or "").strip().lower() != invitation.email and not (
        settings.INVITATION_ANY_ADDRESS
    ):
        raise PermissionDenied(
            "this invitation was sent to another e-mail address than your account's"
        )
    project = invitation.project
    membership = Membership.objects.filter(project=project, user=user).first()
    if membership is None:
        membership = Membership.objects.create(project=project, user=user, role=invitation.role)
    invitation.status, invitation.accepted_at = Invitation.Status.ACCEPTED, timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["status", "accepted_at", "accepted_by"])
    audit.record("invitation.accept", invitation, project=project, detail={"role": membership.role})
    events.emit(
        "member.joined",
        project=project,
        obj=membership,
        message=f"{user.get_username()} joined {project.slug} as {membership.role}",
        payload={"username": user.get_username(), "role": membership.role},
        mail=True,
    )
    return membership
