"""Every write to users, projects, memberships, quotas, SSH keys and API tokens.

Each service is keyword-only, runs in one transaction, checks its preconditions (raising
``controlplane.errors``), and records an audit event in that same transaction.
"""

import hashlib
import secrets
from datetime import date, datetime

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput, PermissionDenied
from tenants import quotas
from tenants.choices import ProjectStatus, Role
from tenants.models import (
    ApiToken,
    Invoice,
    Membership,
    PointsEntry,
    Project,
    Quota,
    SSHKey,
    UsageRecord,
    User,
    default_quota,
    slug_validator,
)
from tenants.sshkeys import InvalidSSHKey, parse_public_key

TOKEN_PREFIX = "kumo_"

# --- users ----------------------------------------------------------------------------------


@transaction.atomic
def user_create(
    *,
    username: str,
    email: str = "",
    password: str | None = None,
    is_staff: bool = False,
    first_name: str = "",
    last_name: str = "",
) -> User:
    if User.objects.filter(username=username).exists():
        raise Conflict(f"username {username!r} is taken", details={"username": ["taken"]})
    user = User(
        username=username,
        email=email,
        is_staff=is_staff,
        is_superuser=is_staff,
        first_name=first_name,
        last_name=last_name,
    )
    if password is None:
        user.set_unusable_password()
    else:
        try:
            validate_password(password, user)
        except ValidationError as e:
            raise InvalidInput(
                f"password: {e.messages[0]}", details={"password": e.messages}
            ) from None
        user.set_password(password)
    user.save()
    audit.record("user.create", user, detail={"is_staff": is_staff})
    return user


# --- projects -------------------------------------------------------------------------------


def _check_validity(valid_from: date | None, valid_until: date | None) -> None:
    if valid_from and valid_until and valid_until < valid_from:
        raise InvalidInput.field("valid_until", "must not be before valid_from")


@transaction.atomic
def project_create(
    *,
    slug: str,
    name: str,
    owner: User,
    description: str = "",
    valid_from: date | None = None,
    valid_until: date | None = None,
    quota: dict[str, int] | None = None,
) -> Project:
    """Create a project with ``owner`` as its first owner and the default quota."""
    try:
        slug_validator(slug)
    except ValidationError as e:
        raise InvalidInput.field("slug", e.messages[0]) from None
    _check_validity(valid_from, valid_until)
    if Project.objects.filter(slug=slug).exists():
        raise Conflict(f"a project with slug {slug!r} exists", details={"slug": ["taken"]})
    project = Project.objects.create(
        slug=slug,
        name=name,
        description=description,
        owner=owner,
        valid_from=valid_from,
        valid_until=valid_until,
    )
    Membership.objects.create(project=project, user=owner, role=Role.OWNER)
    Quota.objects.create(project=project, **{**default_quota(), **(quota or {})})
    audit.record("project.create", project, project=project, detail={"owner": owner.username})
    return project


_PROJECT_EDITABLE = ("name", "description", "valid_from", "valid_until")


@transaction.atomic
def project_update(*, project: Project, **changes) -> Project:
    """Change a project's name, description or validity period."""
    unknown = set(changes) - set(_PROJECT_EDITABLE)
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "cannot be changed here")
    project = Project.objects.select_for_update().get(pk=project.pk)
    _check_validity(
        changes.get("valid_from", project.valid_from),
        changes.get("valid_until", project.valid_until),
    )
    changed = {k: v for k, v in changes.items() if getattr(project, k) != v}
    for field, value in changed.items():
        setattr(project, field, value)
    if changed:
        project.save(update_fields=[*changed, "updated_at"])
        audit.record(
            "project.update",
            project,
            project=project,
            detail={k: str(v) if isinstance(v, date | datetime) else v for k, v in changed.items()},
        )
    return project


@transaction.atomic
def project_set_status(*, project: Project, status: str, reason: str = "") -> Project:
    """Suspend, reactivate or expire a project (operators and the controller)."""
    if status not in ProjectStatus.values:
        raise InvalidInput.field("status", f"must be one of {', '.join(ProjectStatus.values)}")
    project = Project.objects.select_for_update().get(pk=project.pk)
    if project.status != status:
        previous, project.status = project.status, status
        project.save(update_fields=["status", "updated_at"])
        audit.record(
            "project.set_status",
            project,
            project=project,
            detail={"from": previous, "to": status, "reason": reason},
        )
    return project


@transaction.atomic
def project_delete(*, project: Project) -> None:
    """Delete an empty project that was never billed. A project that still holds resources
    answers 409 ``project_not_empty``. So does one with billing records (usage intervals,
    invoices, a points ledger), ``project_billed``: they would go with it, and a bill
    outlives what it bills. Such a project ends with its validity instead (or an operator
    suspends it), keeping its records."""
    in_use = {k: v for k, v in quotas.usage(project).items() if v}
    if in_use:
        held = ", ".join(f"{k}={v}" for k, v in sorted(in_use.items()))
        raise Conflict(
            f"project {project.slug} still holds resources ({held}); delete them first",
            code="project_not_empty",
            details={"usage": in_use},
        )
    billed = [
        name
        for name, model in (
            ("usage_records", UsageRecord),
            ("invoices", Invoice),
            ("points_entries", PointsEntry),
        )
        if model.objects.for_project(project).exists()
    ]
    if billed:
        raise Conflict(
            f"project {project.slug} has been billed ({', '.join(billed)}), and its bills are"
            " kept: it is not deleted; it ends with its validity (valid_until)",
            code="project_billed",
            details={"billing": billed},
        )
    audit.record("project.delete", project, project=project)
    project.delete()


# --- memberships ----------------------------------------------------------------------------


def role_of(user: User, project: Project) -> str | None:
    return (
        Membership.objects.filter(project=project, user=user).values_list("role", flat=True).first()
    )


def _may_grant(actor: User | None, project: Project, role: str) -> None:
    """Only owners (and operators) hand out or take away the owner role."""
    if role != Role.OWNER or actor is None or actor.is_staff:
        return
    if role_of(actor, project) != Role.OWNER:
        raise PermissionDenied("only an owner can grant or change the owner role")


@transaction.atomic
def membership_add(
    *, project: Project, user: User, role: str = Role.MEMBER, actor: User | None = None
) -> Membership:
    """Make ``user`` a member of ``project`` (operators in the admin console, and
    ``manage.py bootstrap``). Nothing a project admin reaches calls this: people join by
    accepting an invitation (``tenants.invitations``), so no admin learns who has an account
    by naming them."""
    if role not in Role.values:
        raise InvalidInput.field("role", f"must be one of {', '.join(Role.values)}")
    _may_grant(actor, project, role)
    try:
        with transaction.atomic():
            membership = Membership.objects.create(project=project, user=user, role=role)
    except IntegrityError:
        raise Conflict(
            f"{user.username} is already a member of {project.slug}",
            code="already_member",
            details={"user": ["already a member"]},
        ) from None
    audit.record(
        "membership.add",
        membership,
        project=project,
        detail={"user": user.username, "role": role},
    )
    return membership


def _last_owner(membership: Membership) -> bool:
    return (
        membership.role == Role.OWNER
        and not Membership.objects.filter(project_id=membership.project_id, role=Role.OWNER)
        .exclude(pk=membership.pk)
        .exists()
    )


@transaction.atomic
def membership_update(
    *, membership: Membership, role: str, actor: User | None = None
) -> Membership:
    if role not in Role.values:
        raise InvalidInput.field("role", f"must be one of {', '.join(Role.values)}")
    # Lock every owner row of the project so two demotions cannot leave it with none.
    list(
        Membership.objects.select_for_update().filter(
            project_id=membership.project_id, role=Role.OWNER
        )
    )
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    if membership.role == role:
        return membership
    if Role.OWNER in (role, membership.role):
        _may_grant(actor, membership.project, Role.OWNER)
    if _last_owner(membership):
        raise Conflict("a project keeps at least one owner", code="last_owner")
    previous, membership.role = membership.role, role
    membership.save(update_fields=["role"])
    audit.record(
        "membership.update",
        membership,
        project=membership.project,
        detail={"user": membership.user.username, "from": previous, "to": role},
    )
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership, actor: User | None = None) -> None:
    list(
        Membership.objects.select_for_update().filter(
            project_id=membership.project_id, role=Role.OWNER
        )
    )
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    _may_grant(actor, membership.project, membership.role)
    if _last_owner(membership):
        raise Conflict("a project keeps at least one owner", code="last_owner")
    audit.record(
        "membership.remove",
        membership,
        project=membership.project,
        detail={"user": membership.user.username, "role": membership.role},
    )
    ApiToken.objects.filter(
        user=membership.user, project=membership.project, revoked_at=None
    ).update(revoked_at=timezone.now())
    membership.delete()


# --- quotas ---------------------------------------------------------------------------------


@transaction.atomic
def quota_set(*, project: Project, **limits: int) -> Quota:
    """Set some of a project's limits (operators). Lowering below usage is allowed: what
    exists keeps running and nothing new fits until usage drops."""
    unknown = set(limits) - set(Quota.RESOURCES)
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "is not a quota resource")
    for name, value in limits.items():
        if not isinstance(value, int) or value < 0:
            raise InvalidInput.field(name, "must be a whole number, 0 or more")
    quota = Quota.objects.select_for_update().get(project=project)
    changed = {k: (getattr(quota, k), v) for k, v in limits.items() if getattr(quota, k) != v}
    for name, (_, new) in changed.items():
        setattr(quota, name, new)
    if changed:
        quota.save()
        audit.record(
            "quota.update",
            quota,
            project=project,
            detail={k: {"from": old, "to": new} for k, (old, new) in changed.items()},
        )
    return quota


# --- SSH keys -------------------------------------------------------------------------------


@transaction.atomic
def sshkey_add(*, user: User, public_key: str, name: str = "") -> SSHKey:
    try:
        parsed = parse_public_key(public_key)
    except InvalidSSHKey as e:
        raise InvalidInput.field("public_key", str(e)) from None
    name = (name or parsed.comment or parsed.fingerprint[-12:]).strip()[:100]
    clash = SSHKey.objects.filter(user=user).filter(
        Q(fingerprint=parsed.fingerprint) | Q(name=name)
    )
    for existing in clash:
        field = "public_key" if existing.fingerprint == parsed.fingerprint else "name"
        reason = (
            f"you already have this key, named {existing.name!r}"
            if field == "public_key"
            else "you already have a key with this name"
        )
        raise Conflict(f"{field}: {reason}", details={field: [reason]})
    key = SSHKey.objects.create(
        user=user,
        name=name,
        public_key=parsed.normalized,
        key_type=parsed.key_type,
        bits=parsed.bits,
        fingerprint=parsed.fingerprint,
        comment=parsed.comment,
    )
    audit.record("sshkey.add", key, detail={"fingerprint": key.fingerprint})
    return key


@transaction.atomic
def sshkey_delete(*, key: SSHKey) -> None:
    audit.record("sshkey.delete", key, detail={"fingerprint": key.fingerprint})
    key.delete()


# --- API tokens -----------------------------------------------------------------------------


def token_digest(secret_token: str) -> str:
    return hashlib.sha256(secret_token.encode()).hexdigest()


@transaction.atomic
def token_create(
    *,
    user: User,
    name: str,
    project: Project | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; returns it with its secret, which is never stored nor shown again."""
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput.field("expires_at", "must be in the future")
    if project is not None and not Membership.objects.filter(project=project, user=user).exists():
        raise InvalidInput.field("project", "you are not a member of this project")
    prefix = secrets.token_hex(6)
    secret_token = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        digest=token_digest(secret_token),
        project=project,
        expires_at=expires_at,
    )
    audit.record(
        "token.create",
        token,
        project=project,
        detail={"expires_at": expires_at.isoformat() if expires_at else None},
    )
    return token, secret_token


@transaction.atomic
def token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke a token; revoking a revoked token changes nothing."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit.record("token.revoke", token, project=token.project)
    return token


def token_touch(*, token: ApiToken, now: datetime, every_s: int = 60) -> None:
    """Record that a token was used; at most one write a minute per token, so
    authentication does not turn every read into a write."""
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() >= every_s:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now


def projects_expire(*, today: date | None = None) -> list[str]:
    """Mark expired every active project whose validity ended before ``today``; returns their
    slugs. What happens to their resources is reclamation's business."""
    today = today or timezone.localdate()
    slugs = []
    due = Project.objects.filter(status=ProjectStatus.ACTIVE, valid_until__lt=today)
    for project in due:
        project_set_status(
            project=project,
            status=ProjectStatus.EXPIRED,
            reason=f"valid until {project.valid_until}",
        )
        slugs.append(project.slug)
    return slugs
