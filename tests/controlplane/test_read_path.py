"""The API's read path: a page and its count in one query (``controlplane.api.pagination``),
date-times formatted by PostgreSQL (``controlplane.api.fastread``), a list with no filter
value that builds no FilterSet (``controlplane.api.filters``) and a project request's token
read with the caller's membership (``tenants.selectors.token_by_prefix``). Each answers as
the path it replaces does."""

from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from django.core.exceptions import ValidationError
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


def _ids(response):
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


@pytest.mark.postgres
def test_a_compiled_read_answers_each_request_with_its_own_projects_rows(
    client_for, project, other_project
):
    """A plain list or detail runs SQL compiled once for its view (``fastread.CompiledRead``)
    whatever the project: each request binds its own project's id, so one project's or
    user's request never reads another's rows through that SQL, first or later."""
    from controlplane.api import fastread

    fastread._compiled.clear()
    _events(project, 3)
    _events(other_project, 2)
    both = add_member(project, role=Role.READER)
    add_member(other_project, user=both, role=Role.READER)
    rows = {
        p.slug: set(AuditEvent.objects.filter(project=p).values_list("id", flat=True))
        for p in (project, other_project)
    }
    mine = next(iter(rows[project.slug]))

    def lists(slug):
        return reverse("api:project-auditevent-list", kwargs={"project_slug": slug})

    def detail(slug, pk):
        kwargs = {"project_slug": slug, "pk": pk}
        return reverse("api:project-auditevent-detail", kwargs=kwargs)

    owner, other_owner, member = (
        client_for(project.owner),
        client_for(other_project.owner),
        client_for(both),
    )
    for _ in range(2):  # compiling, then compiled
        assert _ids(owner.get(lists(project.slug))) == rows[project.slug]
        assert _ids(other_owner.get(lists(other_project.slug))) == rows[other_project.slug]
        assert _ids(member.get(lists(other_project.slug))) == rows[other_project.slug]
        assert _ids(member.get(lists(project.slug))) == rows[project.slug]
        assert owner.get(detail(project.slug, mine)).json()["id"] == mine
        assert member.get(detail(project.slug, mine)).json()["id"] == mine
        assert member.get(detail(other_project.slug, mine)).status_code == 404
        assert other_owner.get(detail(other_project.slug, mine)).status_code == 404
        assert other_owner.get(detail(project.slug, mine)).status_code == 404
        assert owner.get(lists(other_project.slug)).status_code == 404
    compiled = {key[2]: read for key, read in fastread._compiled.items()}
    assert compiled.keys() == {"list", "retrieve"} and all(compiled.values())
    for read in compiled.values():  # the SQL holds no project's id: each request binds its own
        assert project.pk not in read.params and other_project.pk not in read.params


@pytest.mark.postgres
def test_a_compiled_read_answers_as_the_orm_path(client_for, project, monkeypatch):
    """Pages, sizes, a page past the end, keys that name nothing or cannot be a key: the
    same status and bytes as when each request builds its query with the ORM."""
    from controlplane.api import fastread
    from controlplane.api.viewsets import ProjectScopedViewSet

    _events(project, 7)
    api = client_for(project.owner)
    url = reverse("api:project-auditevent-list", kwargs={"project_slug": project.slug})
    pk = AuditEvent.objects.filter(project=project).latest("id").pk
    requests = [
        (url, {}),
        (url, {"page_size": 3}),
        (url, {"page_size": 3, "page": 3}),
        (url, {"page_size": 3, "page": 4}),
        (url, {"page_size": 3, "page": 0}),
        (url, {"page": 2**62}),
        (f"{url}{pk}/", {}),
        (f"{url}{pk + 1000}/", {}),
        (f"{url}0{pk}/", {}),
        (f"{url}99999999999999999999/", {}),
        (f"{url}-1/", {}),
        (f"{url}x/", {}),
    ]
    fastread._compiled.clear()
    compiled = [(r.status_code, r.content) for r in (api.get(u, q) for u, q in requests)]
    assert all(fastread._compiled.values())
    monkeypatch.setattr(ProjectScopedViewSet, "_read_scope", lambda view: None)
    assert [(r.status_code, r.content) for r in (api.get(u, q) for u, q in requests)] == compiled


@pytest.mark.postgres
def test_a_read_is_compiled_only_when_its_values_are_its_only_variables(project):
    from django.utils import timezone

    from controlplane.compiled import compile_read

    _events(project, 2)
    events = AuditEvent.objects.values("id", "at", "detail", "project_slug")
    read = compile_read(lambda p: events.filter(project_id=p).order_by("id"), 1)
    expected = list(events.filter(project_id=project.pk).order_by("id"))
    assert read.rows((project.pk,)) == expected  # converted as the ORM converts
    refused = {
        "a time in the query": lambda p: events.filter(project_id=p, at__lt=timezone.now()),
        "a value the stand-in does not reach": lambda p: events.filter(project_id=project.pk),
        "a value that is not a column's": lambda p: events.filter(project__slug=str(p)),
        "models with what the ORM adds beyond their rows": lambda p: AuditEvent.objects.filter(
            project_id=p
        ).prefetch_related("project"),
        "models annotated": lambda p: AuditEvent.objects.filter(project_id=p).annotate(
            n=Count("pk")
        ),
        "a query nothing can match": lambda p: events.filter(project_id=p, pk__in=[]),
    }
    for reason, build in refused.items():
        assert compile_read(build, 1) is None, reason


@pytest.mark.embedded
def test_a_compiled_read_builds_the_orms_objects_keyed_by_a_uuid_or_a_text(project, other_project):
    """A read of model objects with their ``select_related`` objects, keyed by a UUID (bound
    as the database takes a ``UUIDField``: the UUID on PostgreSQL, its hex digits on SQLite,
    the embedded pass) or by a text, answers the objects the ORM builds; a value that is not
    the read's kind is refused as the ORM refuses it."""
    from controlplane.compiled import Compiled
    from controlplane.models import Operation
    from controlplane.services import operation_create

    operations = [
        operation_create(kind="vm.create", target=target, project=owner)
        for target, owner in ((project, project), (other_project, other_project), (project, None))
    ]
    by_key = Compiled(lambda pk: Operation.objects.filter(pk=pk).select_related("project"), UUID)
    by_target = Compiled(
        lambda target: Operation.objects.filter(target_id=target).order_by("created_at"), str
    )

    def seen(objects):
        return [
            (vars(o) | {"_state": None}, o.project and vars(o.project) | {"_state": None})
            for o in objects
        ]

    for operation in operations:
        ours = by_key.objects(operation.pk)
        assert seen(ours) == seen(
            Operation.objects.filter(pk=operation.pk).select_related("project")
        )
        assert ours[0]._state.adding is False and ours[0]._state.db == "default"
        assert by_key.objects(str(operation.pk))[0].pk == operation.pk  # as a report names it
        targets = Operation.objects.filter(target_id=operation.target_id).order_by("created_at")
        assert seen(by_target.objects(operation.target_id)) == seen(targets)
    assert by_key.objects(uuid4()) == [] and by_target.objects("nobody's") == []
    with pytest.raises(ValidationError):
        Operation.objects.filter(pk="not a uuid").first()
    with pytest.raises(ValidationError):
        by_key.objects("not a uuid")


@pytest.mark.embedded
def test_a_compiled_update_writes_what_the_orms_update_writes(project, other_project):
    """``CompiledUpdate`` runs the statement ``QuerySet.update`` makes, with each run's
    values bound where the stand-ins were (a UUID key, a time as a ``DateTimeField`` binds
    it on PostgreSQL and on SQLite, a number, a text, None as NULL), and answers the rows it
    updated; an UPDATE whose SQL depends on more than its values is refused at its run."""
    from django.db.models import F, Value
    from django.db.models.functions import Concat
    from django.utils import timezone

    from controlplane.compiled import CompiledUpdate
    from controlplane.models import Operation
    from controlplane.services import operation_create

    ours, theirs = (
        operation_create(kind="vm.create", target=target, project=target)
        for target in (project, other_project)
    )
    finish = CompiledUpdate(
        lambda pk, at, message, code: (
            Operation.objects.filter(pk=pk, state__in=["pending", "running"]),
            {
                "finished_at": at,
                "updated_at": F("created_at"),
                "error_message": Concat(Value(message), Value("!")),
                "error_code": code,
                "state": "failed",
            },
        ),
        UUID,
        datetime,
        str,
        str,
    )
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert finish.run(str(ours.pk), at, "lost", "E1") == 1  # a key as a report names it
    Operation.objects.filter(pk=theirs.pk, state__in=["pending", "running"]).update(
        finished_at=at,
        updated_at=F("created_at"),
        error_message=Concat(Value("lost"), Value("!")),
        error_code="E1",
        state="failed",
    )
    columns = ("finished_at", "updated_at", "error_message", "error_code", "state")
    ours.refresh_from_db()
    theirs.refresh_from_db()
    assert [getattr(ours, c) for c in columns[2:]] == [getattr(theirs, c) for c in columns[2:]]
    assert ours.finished_at == at == theirs.finished_at and ours.updated_at == ours.created_at
    assert finish.run(ours.pk, at, "again", "E2") == 0  # failed already: no row matches
    assert finish.run(uuid4(), at, "nobody", "E3") == 0
    clear = CompiledUpdate(
        lambda pk, at: (Operation.objects.filter(pk=pk), {"finished_at": at}), UUID, datetime
    )
    assert clear.run(ours.pk, None) == 1
    ours.refresh_from_db()
    assert ours.finished_at is None
    refused = CompiledUpdate(
        lambda pk: (Operation.objects.filter(pk=pk), {"finished_at": timezone.now()}), UUID
    )
    with pytest.raises(AssertionError, match="cannot be compiled"):
        refused.run(ours.pk)
    unmatched = CompiledUpdate(  # a WHERE nothing can match: refused, not an EmptyResultSet
        lambda pk: (Operation.objects.filter(pk=pk, id__in=[]), {"error_code": "x"}), UUID
    )
    with pytest.raises(AssertionError, match="cannot be compiled"):
        unmatched.run(ours.pk)


@pytest.mark.embedded
def test_a_rows_update_is_compiled_for_each_shape_of_plain_values(project, other_project):
    """``update_where`` writes what ``filter(**where).update(**changes)`` writes: a shape of
    plain values (keys, texts, times, JSON values, a relation's key or None) through one
    compiled statement, any other shape (a related object) through the ORM's update."""
    from django.db import connection
    from django.utils import timezone

    from controlplane import compiled
    from controlplane.compiled import CompiledUpdate, update_where
    from controlplane.models import Operation
    from controlplane.services import operation_create

    op = operation_create(kind="vm.create", target=project, project=project)
    at = timezone.now()
    plain = {"state": "failed", "finished_at": at, "error_code": "E1", "project": None}
    assert update_where(Operation, {"pk": op.pk, "state": "pending"}, plain) == 1
    assert update_where(Operation, {"pk": op.pk, "state": "pending"}, plain) == 0  # failed now
    vendor = connection.vendor
    shape = (vendor, Operation, "pk", "state", "=", *plain)
    assert isinstance(compiled._SHAPES[shape], CompiledUpdate)
    op.refresh_from_db()
    assert (op.state, op.finished_at, op.error_code, op.project_id) == ("failed", at, "E1", None)
    assert update_where(Operation, {"pk": op.pk}, {"result": {"n": [1, "é"]}}) == 1  # JSON
    assert isinstance(compiled._SHAPES[(vendor, Operation, "pk", "=", "result")], CompiledUpdate)
    assert update_where(Operation, {"pk": op.pk}, {"result": [1, None]}) == 1  # the same shape
    assert update_where(Operation, {"pk": op.pk}, {"project": other_project}) == 1  # an object
    assert compiled._SHAPES[(vendor, Operation, "pk", "=", "project")] is None  # the ORM's
    op.refresh_from_db()
    assert op.result == [1, None] and op.project_id == other_project.pk
    assert update_where(Operation, {"pk": op.pk}, {"result": {"n": [1, "é"]}}) == 1
    op.refresh_from_db()
    assert op.result == {"n": [1, "é"]}
    assert update_where(Operation, {"pk": op.pk, "finished_at": None}, {"error_code": "E2"}) == 0


@pytest.mark.embedded
def test_refresh_from_a_compiled_read_leaves_an_object_as_refresh_from_db_does(
    project, other_project
):
    """``refresh_from`` with a compiled read of the row gives the object the fields and
    cached relations ``refresh_from_db`` would: a value changed meanwhile is seen, the
    related object read with it is cached, a relation no longer read is dropped."""
    from controlplane.compiled import Compiled, refresh_from
    from controlplane.models import Operation
    from controlplane.services import operation_create

    op = operation_create(kind="vm.create", target=project, project=project)
    read = Compiled(lambda pk: Operation.objects.select_related("project").filter(pk=pk), UUID)
    ours, theirs = (Operation.objects.get(pk=op.pk) for _ in range(2))
    for stale in (ours, theirs):
        assert stale.project == project  # cached, then changed under it
    Operation.objects.filter(pk=op.pk).update(project=other_project, error_code="E9")
    refresh_from(ours, read.objects(op.pk)[0])
    theirs.refresh_from_db(from_queryset=Operation.objects.select_related("project"))

    def seen(o):
        return vars(o) | {"_state": None}, vars(o._state) | {"fields_cache": None}

    assert seen(ours) == seen(theirs) and ours.error_code == "E9"
    assert ours._state.fields_cache.keys() == theirs._state.fields_cache.keys() == {"project"}
    assert ours.project.pk == other_project.pk


@pytest.mark.postgres
def test_a_compiled_read_answers_as_its_plan_renders_its_rows(project, other_project):
    """``CompiledRead.answers`` makes the plan's answers straight from the fetched rows: the
    same as ``render_many`` of the rows ``values()`` gives, for its own project only, with
    date-times formatted by PostgreSQL or parsed (a time zone other than UTC)."""
    from django.utils import timezone

    from controlplane.api.fastread import plan_for
    from controlplane.api.serializers import AuditEventSerializer
    from controlplane.compiled import compile_read

    AuditEvent.objects.bulk_create(
        AuditEvent(
            project=p,
            project_slug=p.slug,
            action=f"a.{i}",
            object_id=str(i),
            detail=[{}, {"n": i, "x": [1.5, None, "é\u2028"]}, [1e-07, True], "text", 3][i % 5],
        )
        for p in (project, other_project)
        for i in range(6)
    )
    plan = plan_for(AuditEventSerializer)
    for zone in ("UTC", "Asia/Tokyo"):
        with timezone.override(zone):
            read = compile_read(
                lambda p: plan.select(AuditEvent.objects.filter(project_id=p)).order_by("id"), 1
            )
            rows = read.rows((project.pk,))
            answers, first = read.answers(plan, (project.pk,))
            assert answers == plan.render_many(rows) and first == rows[0]
            expected = plan.render_many(
                plan.select(AuditEvent.objects.filter(project=project)).order_by("id")
            )
            assert answers == expected and {a["project"] for a in answers} == {project.slug}
            assert read.answers(plan, (-1,)) == ([], None)


def test_a_json_column_is_read_as_djangos_from_db_value_reads_it():
    """The JSON column's shortcut (``compiled._column_converter``) answers what Django's
    ``JSONField.from_db_value`` answers, for any text the column could hold and more."""
    from django.db import connection
    from django.db.models.expressions import Col
    from django.db.models.fields.json import KeyTransform

    from controlplane.compiled import _column_converter

    field = AuditEvent._meta.get_field("detail")
    column = Col("controlplane_auditevent", field)
    texts = [
        None, "{}", "[]", '{"n": 1, "changed": ["name"]}', '{"b": 1, "a": {"c": [1.50, 1e5]}}',
        '"text"', "3", "-0", "1.0", "true", "null", '"\\u00e9\\u2028"', " {}", "{} ", "\ufeff{}",
        "{", "", "nope", '{"a": 1}{"b": 2}', "NaN", "[1, 2,]", b"{}",
    ]  # fmt: skip
    fast = _column_converter([field.from_db_value], column, connection)
    for text in texts:
        expected = field.from_db_value(text, column, connection)
        assert repr(fast(text)) == repr(expected), text  # repr: NaN, and 1 against 1.0
    keyed = _column_converter([field.from_db_value], KeyTransform("n", column), connection)
    assert keyed(3) == 3 and keyed("[1]") == [1]


def test_a_page_lists_its_rows_as_djangos_page():
    from controlplane.api.pagination import ListPage

    project = make_project()
    _events(project, 5)
    queryset = AuditEvent.objects.filter(project=project).order_by("id")
    for objects in (queryset, list(queryset.values("id")), queryset.values_list("id")):
        ours = DjangoPaginator(objects, 2)
        ours._get_page = ListPage
        for number in (1, 2, 3):
            assert list(ours.page(number)) == list(DjangoPaginator(objects, 2).page(number))


def test_a_lists_queryset_is_its_projects_once_read(project, other_project):
    """A list's queryset defers building its project filter until it is read (a compiled
    page never reads it); read, it is the scoped queryset's, query and rows."""
    from types import SimpleNamespace

    from controlplane.api.views import ProjectAuditEventViewSet

    _events(project, 2)
    _events(other_project, 3)
    for action in ("list", "retrieve"):
        view = ProjectAuditEventViewSet(action=action)
        view.membership = SimpleNamespace(project=project)
        queryset, scoped = view.get_queryset(), AuditEvent.objects.for_project(project)
        assert str(queryset.order_by("id").query) == str(scoped.order_by("id").query)
        assert set(queryset) == set(scoped) and {e.project_id for e in queryset} == {project.pk}


@pytest.mark.postgres
def test_a_statement_run_again_is_kept_prepared_and_logged_with_its_values(project):
    """``controlplane.prepared``: a statement a connection runs a sixth time is kept prepared
    on it where the settings prepare (as they do by default), and nothing is with them off;
    either way it answers the same, and Django's query log shows it with its values."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    connection.ensure_connection()
    threshold = connection.connection.prepare_threshold
    runs = 6
    with CaptureQueriesContext(connection) as queries:
        for _ in range(runs):
            with connection.cursor() as cursor:
                cursor.execute("SELECT %s::int + 1, %s", [41, project.slug])
                assert cursor.fetchone() == (42, project.slug)
    assert [q["sql"] for q in queries.captured_queries] == [
        f"SELECT 41::int + 1, '{project.slug}'"
    ] * runs
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = %s",
            ["SELECT $1::int + 1, $2"],
        )
        assert cursor.fetchone() == ((1,) if threshold == 5 else (0,))


@pytest.mark.embedded
def test_a_compiled_insert_writes_the_row_save_writes(project, monkeypatch):
    """``compiled.insert`` writes a new instance's row as ``save`` would, without ``save``:
    a key the database chooses is read back (an audit event's), a key the model makes is
    written (an operation's UUID), each field's ``pre_save`` runs (``auto_now_add``), and
    the instance is saved as far as Django can tell. Read back, the rows hold what was
    given."""
    from django.db import models

    from controlplane.compiled import insert
    from controlplane.models import Operation

    def not_by_save(*args, **kwargs):
        raise AssertionError("written by save, not by its own INSERT")

    monkeypatch.setattr(models.Model, "save_base", not_by_save)

    event = AuditEvent(action="test.insert", object_type="x", detail={"n": 1}, project=project)
    insert(event)
    assert event.pk is not None and not event._state.adding
    row = AuditEvent.objects.get(pk=event.pk)
    assert (row.action, row.detail, row.project_id) == ("test.insert", {"n": 1}, project.pk)
    assert row.at is not None and row.at == event.at

    operation = Operation(
        kind="vm.create", target_type="t", target_id="1", project=project, deadline_at=event.at
    )
    chosen = operation.pk
    insert(operation)
    assert operation.pk == chosen and not operation._state.adding
    assert Operation.objects.filter(pk=chosen, kind="vm.create", project=project).exists()
    assert Operation.objects.get(pk=chosen).created_at == operation.created_at


@pytest.mark.embedded
def test_a_compiled_insert_of_a_model_something_listens_to_is_saved_by_save(project):
    """A model whose save signals have a receiver is written by ``save`` itself, so the
    receiver hears of the row: ``insert`` skips nothing that listens."""
    from django.db.models.signals import post_save

    from controlplane.compiled import insert
    from controlplane.models import Operation

    heard = []

    def listener(sender, instance, created, **kwargs):
        heard.append((instance.pk, created))

    post_save.connect(listener, sender=Operation, weak=False, dispatch_uid="test-insert")
    try:
        operation = Operation(kind="vm.create", target_type="t", target_id="1", project=project)
        operation.deadline_at = operation.created_at or datetime.now(UTC)
        insert(operation)
    finally:
        post_save.disconnect(dispatch_uid="test-insert", sender=Operation)
    assert heard == [(operation.pk, True)]
    assert Operation.objects.filter(pk=operation.pk).exists()


@pytest.mark.embedded
def test_a_compiled_update_returning_answers_the_rows_as_a_read_after_it(project, other_project):
    """``CompiledUpdate.returning`` writes what ``run`` writes, in the same statement as the
    read of the rows it updated: each is the instance a read after it builds (every field,
    a JSON value and times converted as the ORM converts them); none when nothing matched."""
    from django.utils import timezone

    from controlplane.compiled import CompiledUpdate
    from controlplane.models import Operation
    from controlplane.services import operation_create

    ours, theirs = (
        operation_create(kind="vm.create", target=target, project=target)
        for target in (project, other_project)
    )
    finish = CompiledUpdate(
        lambda pk, at, result: (
            Operation.objects.filter(pk=pk, state__in=["pending", "running"]),
            {"state": "succeeded", "finished_at": at, "updated_at": at, "result": result},
        ),
        UUID,
        datetime,
        dict,
    )
    at = timezone.now()
    (answered,) = finish.returning(ours.pk, at, {"state": "running", "n": [1, 2]})
    read = Operation.objects.get(pk=ours.pk)
    fields = [f.attname for f in Operation._meta.concrete_fields]
    assert [getattr(answered, f) for f in fields] == [getattr(read, f) for f in fields]
    assert (answered.state, answered.finished_at, answered.result["n"]) == ("succeeded", at, [1, 2])
    assert not answered._state.adding
    assert Operation.objects.get(pk=theirs.pk).state == "pending"  # not matched: untouched
    assert finish.returning(ours.pk, at, {}) == []  # finished already: nothing matches


@pytest.mark.embedded
def test_a_compiled_insert_of_many_is_one_insert_of_the_rows_save_writes(
    project, other_project, django_assert_num_queries
):
    """``insert_many`` writes new instances of one model in one statement, each with the
    key the database chose for its own row, in the order given."""
    from controlplane.compiled import insert_many

    events = [
        AuditEvent(action=f"test.many.{n}", object_type="x", project=target, detail={"n": n})
        for n, target in enumerate([project, other_project, project])
    ]
    with django_assert_num_queries(1):
        insert_many(events)
    assert len({e.pk for e in events}) == 3 and all(not e._state.adding for e in events)
    for n, event in enumerate(events):
        row = AuditEvent.objects.get(pk=event.pk)
        assert (row.action, row.detail, row.project_id) == (
            f"test.many.{n}",
            {"n": n},
            event.project_id,
        )


def test_a_kept_cursor_runs_the_compiled_statements_as_djangos_would(project):
    """``prepared.cursor``: where nothing watches the connection, its compiled statements
    run on one cursor kept on it, answering what Django's cursor answers; its errors are
    Django's (an integrity error inside a transaction, then the broken transaction's error
    for the next statement); with the queries logged (as tests count them) or an execute
    wrapper, Django's cursor runs them and they are seen. (A connection lost and replaced
    gets a new one: ``test_database_loss``'s connection lost while idle.)"""
    from django.db import IntegrityError, connection, transaction
    from django.db.transaction import TransactionManagementError
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from controlplane import prepared
    from controlplane.compiled import Compiled, CompiledUpdate, insert
    from controlplane.models import Operation

    read = Compiled(lambda pk: Project.objects.filter(pk=pk).values_list("slug"), int)
    connection.ensure_connection()
    connection.health_check_done = True  # as after a request's first statement
    kept = prepared.cursor(connection)
    assert isinstance(kept, prepared.KeptCursor)
    assert prepared.cursor(connection) is kept
    assert read.tuples(project.pk) == [(project.slug,)]
    with CaptureQueriesContext(connection) as queries:
        assert not isinstance(prepared.cursor(connection), prepared.KeptCursor)
        assert read.tuples(project.pk) == [(project.slug,)]
    assert len(queries.captured_queries) == 1
    seen = []
    with connection.execute_wrapper(lambda execute, *args: seen.append(1) or execute(*args)):
        assert read.tuples(project.pk) == [(project.slug,)]
    assert seen == [1]

    def operation(pk):
        return Operation(
            pk=pk, kind="k", target_type="t", target_id="1", deadline_at=timezone.now()
        )

    rename = CompiledUpdate(
        lambda pk, slug: (Project.objects.filter(pk=pk), {"slug": slug}), int, str
    )
    other = make_project()
    with transaction.atomic():
        first = operation(uuid4())
        insert(first)  # its key the model's: written by the kept cursor's INSERT
        with pytest.raises(IntegrityError), transaction.atomic():  # its savepoint undone
            insert(operation(first.pk))
        with pytest.raises(IntegrityError):  # an update's failure marks the transaction
            rename.run(other.pk, project.slug)
        with pytest.raises(TransactionManagementError):
            read.tuples(project.pk)
        transaction.set_rollback(True)
    assert read.tuples(project.pk) == [(project.slug,)]  # the kept cursor works on
