"""Reads of tenancy data that other code shares."""

from functools import cache

from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet
from django.utils import timezone

from controlplane.rowjoin import Join, JoinedLookup, RowLookup
from tenants import quotas
from tenants.models import (
    ApiToken,
    ExternalIdentity,
    InstitutionReviewer,
    Invitation,
    Membership,
    Project,
    ProjectApplication,
    User,
)


def token_project_id(token) -> int | None:
    return token.project_id if isinstance(token, ApiToken) else None


def membership_for(user, slug: str, *, token=None) -> Membership | None:
    """The user's membership in the project ``slug`` (with the project loaded), or None when
    the user has no role there, or the request's token is scoped to another project.

    A token read by ``token_by_prefix`` for this same slug already carries the answer (read
    in the token's own query, under the same conditions): no second query."""
    if not getattr(user, "is_authenticated", False):
        return None
    prefetched = getattr(token, "prefetched_membership", None)
    if prefetched is not None and prefetched[0] == slug and token.user_id == user.pk:
        return prefetched[1]
    scoped = token_project_id(token)
    if scoped is None:
        return _membership_lookup(scoped=False).first(user.pk, slug)
    return _membership_lookup(scoped=True).first(user.pk, slug, scoped)


@cache
def _membership_lookup(*, scoped: bool) -> JoinedLookup:
    """A session's API request's second query (after its user's): built once, not per
    request. (user, project slug) is unique, so it matches at most one membership."""
    where = 'm."user_id" = %s AND r."slug" = %s'
    if scoped:
        where += ' AND m."project_id" = %s'
    return JoinedLookup(Membership, "project", where)


def token_by_prefix(prefix: str, *, project_slug: str | None = None) -> ApiToken | None:
    """The API token whose public prefix is ``prefix`` (unique), with its user, or None.

    Given ``project_slug`` (the request's URL names a project), the same query also reads
    the token's user's membership there with its project, under ``membership_for``'s
    conditions (a token scoped to another project has none), and keeps it on the token as
    ``prefetched_membership = (slug, membership or None)``: a project's API request then
    costs one query before its own, not two."""
    if project_slug is None:
        found = _token_lookup(with_membership=False).first(prefix)
    else:
        found = _token_lookup(with_membership=True).first(project_slug, prefix)
    if found is None:
        return None
    token = found["m"]
    if project_slug is not None:
        token.prefetched_membership = (project_slug, found["ms"])
    return token


@cache
def _token_lookup(*, with_membership: bool) -> RowLookup:
    joins = [Join("u", User, 'u."id" = m."user_id"')]
    relations = [("m", "user", "u")]
    if with_membership:
        joins += [
            Join("p", Project, 'p."slug" = %s', outer=True),
            Join(
                "ms",
                Membership,
                'ms."project_id" = p."id" AND ms."user_id" = m."user_id"'
                ' AND (m."project_id" IS NULL OR m."project_id" = p."id")',
                outer=True,
            ),
        ]
        relations += [("ms", "project", "p"), ("ms", "user", "u")]
    return RowLookup(ApiToken, joins=joins, where='m."prefix" = %s', relations=relations)


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


# --- project applications: who sees and reviews which ---------------------------------------


def _of_reviewed_institution(user) -> Exists:
    """An application whose applicant has an identity at an issuer ``user`` reviews for."""
    issuers = InstitutionReviewer.objects.filter(user=user).values("issuer")
    return Exists(
        ExternalIdentity.objects.filter(user=OuterRef("applicant_id"), issuer__in=issuers)
    )


def _reviewable(user) -> Q:
    """The one rule of who decides on an application: never its own applicant; operators
    every other; an institutional reviewer those of applicants of their institutions."""
    others = ~Q(applicant=user)
    return others if user.is_staff else others & Q(_of_reviewed_institution(user))


def applications_reviewable_by(user) -> QuerySet:
    """The applications ``user`` may approve, return or reject (in any state)."""
    if not getattr(user, "is_authenticated", False):
        return ProjectApplication.objects.none()
    return ProjectApplication.objects.filter(_reviewable(user))


def applications_visible_to(user, *, token=None) -> QuerySet:
    """The applications ``user`` sees: their own, and those they may review (operators:
    all). A token scoped to one project acts for that project only: it lends its user no
    reviewer's view of other people's applications. Each row is annotated ``may_review``."""
    if not getattr(user, "is_authenticated", False):
        return ProjectApplication.objects.none()
    qs = ProjectApplication.objects.all()
    if not user.is_staff:
        mine = Q(applicant=user)
        qs = qs.filter(mine if token_project_id(token) else mine | _reviewable(user))
    return qs.annotate(may_review=ExpressionWrapper(_reviewable(user), output_field=BooleanField()))
