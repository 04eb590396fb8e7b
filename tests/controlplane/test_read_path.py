"""The API's read path: a page and its count in one query (``controlplane.api.pagination``),
date-times formatted by PostgreSQL (``controlplane.api.fastread``), a list with no filter
value that builds no FilterSet (``controlplane.api.filters``) and a project request's token
read with the caller's membership (``tenants.selectors.token_by_prefix``). Each answers as
the path it replaces does."""

from datetime import UTC, datetime

import pytest
from django.core.paginator import EmptyPage, PageNotAnInteger
from django.core.paginator import Paginator as DjangoPaginator
from django.db.models import Count
from django.urls import reverse
from rest_framework import serializers

from controlplane.api.fastread import _IsoUTC
from controlplane.api.pagination import CountingPaginator
from controlplane.models import AuditEvent
from tenants import selectors
from tenants import services as tenants
from tenants.choices import Role
from tenants.models import Project
from tests.factories import add_member, make_project

pytestmark = pytest.mark.django_db


def _events(project, n):
    AuditEvent.objects.bulk_create(
        AuditEvent(project=project, project_slug=project.slug, action=f"a.{i}", object_id=str(i))
        for i in range(n)
    )


def _querysets(project):
    events = AuditEvent.objects.filter(project=project)
    return {
        "models": events,
        "values": events.values("id", "action"),
        "grouped": Project.objects.annotate(n=Count("memberships")).order_by("slug"),
        "distinct": events.order_by("action").distinct(),  # Django's own path
    }


@pytest.mark.parametrize("kind", ["models", "values", "grouped", "distinct"])
@pytest.mark.parametrize("per_page", [1, 3, 7])
def test_a_page_and_its_count_are_djangos(kind, per_page):
    project = make_project()
    for _ in range(3):
        make_project()
    _events(project, 7)
    queryset = _querysets(project)[kind]
    pages = -(-queryset.count() // per_page)
    for number in [*range(1, pages + 1), pages + 1, pages + 5, 0, -1, "x", 2.5]:
        ours, theirs = CountingPaginator(queryset, per_page), DjangoPaginator(queryset, per_page)
        try:
            expected = list(theirs.page(number))
        except (EmptyPage, PageNotAnInteger) as exc:
            with pytest.raises(type(exc), match=str(exc)):
                ours.page(number)
            continue
        page = ours.page(number)
        assert list(page) == expected
        assert (ours.count, ours.num_pages, page.has_next()) == (
            theirs.count,
            theirs.num_pages,
            theirs.page(number).has_next(),
        )


def test_an_empty_list_is_a_first_page_with_nothing(project):
    paginator = CountingPaginator(AuditEvent.objects.filter(project=project, action="none"), 5)
    assert list(paginator.page(1)) == []
    assert paginator.count == 0
    with pytest.raises(EmptyPage, match="That page contains no results"):
        CountingPaginator(AuditEvent.objects.filter(action="none"), 5).page(2)


def test_a_list_nothing_can_match_is_an_empty_first_page(project):
    for queryset in (AuditEvent.objects.none(), AuditEvent.objects.filter(pk__in=[])):
        paginator = CountingPaginator(queryset.order_by("id"), 5)
        assert (list(paginator.page(1)), paginator.count) == ([], 0)


def test_a_page_is_one_query_with_its_count(project, django_assert_num_queries):
    _events(project, 5)
    events = AuditEvent.objects.filter(project=project).order_by("id")
    total = events.count()  # the project's own creation is audited too
    paginator = CountingPaginator(events, 2)
    with django_assert_num_queries(1):
        rows = list(paginator.page(2))
        assert paginator.count == total
    assert all(not hasattr(row, "_kumo_page_total") for row in rows)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 11, 24, 5, 6, 7, tzinfo=UTC),
        datetime(2026, 11, 24, 5, 6, 7, 12, tzinfo=UTC),
        datetime(2026, 11, 24, 5, 6, 7, 500000, tzinfo=UTC),
        datetime(5, 3, 4, 0, 0, 0, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
)
def test_postgresql_writes_a_date_time_as_drf_does(project, value):
    event = AuditEvent.objects.create(project=project, action="a")
    AuditEvent.objects.filter(pk=event.pk).update(at=value)
    text = AuditEvent.objects.filter(pk=event.pk).values_list(_IsoUTC("at"), flat=True).get()
    assert text == serializers.DateTimeField().to_representation(value)


def test_a_list_without_filter_values_is_not_filtered_and_one_with_them_is(client_for, project):
    _events(project, 3)
    url = reverse("api:project-auditevent-list", kwargs={"project_slug": project.slug})
    api = client_for(project.owner)
    everything = api.get(url, {"page_size": 2, "ordering": "at"}).json()
    assert everything["count"] == AuditEvent.objects.filter(project=project).count()
    assert api.get(url, {"action": "a.1"}).json()["count"] == 1
    assert api.get(url, {"since": ""}).status_code == 400  # a typed filter with no value


def test_the_token_query_reads_the_membership_under_the_same_conditions(project, other_project):
    member = add_member(project, role=Role.READER)
    add_member(other_project, user=member)
    outsider = make_project()
    cases = {
        "unscoped": (None, {project.slug: Role.READER, outsider.slug: None}),
        "scoped": (project, {project.slug: Role.READER, other_project.slug: None}),
    }
    for scope, expected in cases.values():
        token, _ = tenants.token_create(user=member, name=f"t{scope}", project=scope)
        prefix = token.prefix
        for slug, role in {**expected, "no-such-project": None}.items():
            read = selectors.token_by_prefix(prefix, project_slug=slug)
            prefetched = read.prefetched_membership
            looked_up = selectors._membership_lookup(scoped=scope is not None).first(
                *((member.pk, slug, scope.pk) if scope else (member.pk, slug))
            )
            assert prefetched[0] == slug
            assert getattr(prefetched[1], "role", None) == role
            assert getattr(looked_up, "pk", None) == getattr(prefetched[1], "pk", None)
            assert selectors.membership_for(member, slug, token=read) is prefetched[1]
            if role:
                assert prefetched[1].project.slug == slug and prefetched[1].user == member
        assert selectors.token_by_prefix(prefix).user == member
    assert selectors.token_by_prefix("nosuchprefix", project_slug=project.slug) is None


def test_a_project_request_costs_one_query_before_its_own(
    client_for, project, django_assert_num_queries
):
    event = AuditEvent.objects.create(project=project, action="a")
    url = reverse(
        "api:project-auditevent-detail", kwargs={"project_slug": project.slug, "pk": event.pk}
    )
    api = client_for(project.owner)
    api.get(url)  # the token's first use records it
    with django_assert_num_queries(2):  # the token with the membership, the event
        assert api.get(url).status_code == 200
