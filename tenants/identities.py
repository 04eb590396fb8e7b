"""Federated identities: what a SAML or OIDC login does to users (the only writer of
``ExternalIdentity``).

A login is found by ``(issuer, subject)`` alone. E-mail never finds a user: two IdPs may
release the same address, and an address may be reassigned, so matching on it would hand
one person's account to another. A first login creates the user just in time with an
unusable password; later logins refresh the profile from the attributes.
"""

import hashlib
import re
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import PermissionDenied
from tenants.models import ExternalIdentity, User

_USERNAME_OK = re.compile(r"^[\w.@+-]{1,150}$")


@dataclass(frozen=True)
class FederatedProfile:
    """What an identity provider said about a person, already mapped to Kumo's names."""

    kind: str  # ExternalIdentity.Kind
    issuer: str
    subject: str
    email: str = ""
    display_name: str = ""
    organisation: str = ""
    affiliation: str = ""
    attributes: dict = field(default_factory=dict)


def _username_for(profile: FederatedProfile) -> str:
    """A readable, unique username: the subject when it is one (an eppn is), else a digest."""
    digest = hashlib.sha256(f"{profile.issuer}#{profile.subject}".encode()).hexdigest()
    base = profile.subject if _USERNAME_OK.match(profile.subject) else f"fed-{digest[:16]}"
    if not User.objects.filter(username=base).exists():
        return base
    return f"{base[:130]}-{digest[:8]}"


def _profile_fields(profile: FederatedProfile) -> dict:
    return {
        "email": profile.email[:254],
        "display_name": profile.display_name[:200],
        "organisation": profile.organisation[:200],
        "affiliation": profile.affiliation[:200],
    }


@transaction.atomic
def federated_login(*, profile: FederatedProfile) -> User:
    """The user behind ``profile``'s issuer and subject, created on first sight.

    Raises PermissionDenied for a deactivated user (audited)."""
    if not profile.issuer or not profile.subject:
        raise PermissionDenied("the identity provider sent no stable subject")
    now = timezone.now()
    identity = (
        ExternalIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=profile.issuer, subject=profile.subject)
        .first()
    )
    if identity is None:
        user = User(username=_username_for(profile), **_profile_fields(profile))
        user.set_unusable_password()
        try:
            with transaction.atomic():
                user.save()
                identity = ExternalIdentity.objects.create(
                    user=user,
                    kind=profile.kind,
                    issuer=profile.issuer,
                    subject=profile.subject,
                    attributes=profile.attributes,
                    last_login_at=now,
                )
        except IntegrityError:  # a concurrent first login won: use its user
            identity = ExternalIdentity.objects.select_related("user").get(
                issuer=profile.issuer, subject=profile.subject
            )
            return identity.user
        audit.set_actor(user)
        audit.record(
            "user.create",
            user,
            detail={"via": profile.kind, "issuer": profile.issuer, "just_in_time": True},
        )
        audit.record("user.federated_login", identity, detail={"first": True})
        return user
    user = identity.user
    if not user.is_active:
        federated_login_refused(
            kind=profile.kind, issuer=profile.issuer, reason="the account is deactivated"
        )
        raise PermissionDenied("this account is deactivated")
    changed = {k: v for k, v in _profile_fields(profile).items() if v and getattr(user, k) != v}
    for name, value in changed.items():
        setattr(user, name, value)
    if changed:
        user.save(update_fields=list(changed))
    identity.attributes, identity.last_login_at = profile.attributes, now
    identity.save(update_fields=["attributes", "last_login_at"])
    audit.set_actor(user)
    audit.record("user.federated_login", identity, detail={"first": False})
    return user


def federated_login_refused(*, kind: str, issuer: str, reason: str, detail: dict | None = None):
    """Audit a refused federated login (bad signature, wrong audience, replay, …).

    Written in a transaction of its own, so the record survives the refusal."""
    with transaction.atomic():
        audit.record(
            "user.federated_login",
            object_type="tenants.externalidentity",
            object_id="",
            object_repr=(issuer or kind)[:200],
            outcome=AuditOutcome.DENIED,
            detail={"kind": kind, "issuer": issuer, "reason": reason, **(detail or {})},
        )


@transaction.atomic
def identity_unlink(*, identity: ExternalIdentity) -> None:
    """Remove a federated identity from its user (operators); the user stays."""
    audit.record("user.identity_unlink", identity, detail={"user": identity.user.username})
    identity.delete()
