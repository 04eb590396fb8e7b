"""Reads of tenancy data that other code shares."""

from tenants import quotas
from tenants.models import ApiToken, Membership, Project


def token_project_id(token) -> int | None:
    return token.project_id if isinstance(token, ApiToken) else None


def membership_for(user, slug: str, *, token=None) -> Membership | None:
    """The user's membership in the project ``slug`` (with the project loaded), or None when
    the user has no role there, or the request's token is scoped to another project."""
    if not getattr(user, "is_authenticated", False):
        return None
    qs = Membership.objects.select_related("project").filter(user=user, project__slug=slug)
    scoped = token_project_id(token)
    if scoped is not None:
        qs = qs.filter(project_id=scoped)
    return qs.first()


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
