"""Reads of tenancy data that other code shares."""

from functools import cache

from django.db.models import Q
from django.utils import timezone

from controlplane.rowjoin import JoinedLookup
from tenants import quotas
from tenants.models import ApiToken, Invitation, Membership, Project, User


def token_project_id(token) -> int | None:
    return token.project_id if isinstance(token, ApiToken) else None


def membership_for(user, slug: str, *, token=None) -> Membership | None:
    """The user's membership in the project ``slug`` (with the project loaded), or None when
    the user has no role there, or the request's token is scoped to another project."""
    if not getattr(user, "is_authenticated", False):
        return None
    scoped = token_project_id(token)
    if scoped is None:
        return _membership_lookup(scoped=False).first(user.pk, slug)
    return _membership_lookup(scoped=True).first(user.pk, slug, scoped)


@cache
def _membership_lookup(*, scoped: bool) -> JoinedLookup:
    """Every API request's second query (after its token's): built once, not per request.
    (user, project slug) is unique, so it matches at most one membership."""
    where = 'm."user_id" = %s AND r."slug" = %s'
    if scoped:
        where += ' AND m."project_id" = %s'
    return JoinedLookup(Membership, "project", where)


def projects_for(user, *, token=None):
    """The projects a user may see, each annotated with the user's role in it."""
    from django.db.models import F

    return (
        Project.objects.visible_to(user, token=token)
        .select_related("owner")
        .annotate(my_role=F("memberships__role"))
    )


def quota_report(project: Project) -> dict:
    """Limits, usage and what is left, per resource."""
    limits = project.quota.limits()
    used = quotas.usage(project)
    return {
        name: {
            "limit": limits[name],
            "used": used[name],
            "available": max(limits[name] - used[name], 0),
        }
        for name in limits
    }


def users_search(q: str = ""):
    """Every user (operators' view), with identities; ``q`` matches username, e-mail, name or
    organisation."""
    qs = User.objects.prefetch_related("external_identities").order_by("username")
    q = q.strip()
    if q:
        qs = qs.filter(
            Q(username__icontains=q)
            | Q(email__icontains=q)
            | Q(display_name__icontains=q)
            | Q(organisation__icontains=q)
        )
    return qs


def pending_invitations(project: Project):
    """The project's invitations that can still be accepted (neither used, revoked nor
    expired), newest first, with their inviter."""
    return (
        Invitation.objects.for_project(project)
        .filter(status=Invitation.Status.PENDING, expires_at__gt=timezone.now())
        .select_related("invited_by")
        .order_by("-created_at", "-pk")
    )
