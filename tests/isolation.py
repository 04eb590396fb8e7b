"""The tenant-isolation contract every project-scoped endpoint must pass.

A concrete test class names the router ``basename`` of its endpoint and says how to make one
of its objects; this mixin then checks, for every role and for outsiders:

- list and retrieve show only the project's own objects;
- another project's object, and a project the caller has no role in, answer 404 with exactly
  the body of a missing one;
- reads need ``read_role``, writes ``write_role`` (403 below it), and a write never leaks
  across projects;
- a create that references another project's objects is refused and creates nothing (a
  contract whose create takes no reference says so: ``create_references_nothing``), and so
  is an action on the project's own object that names another project's
  (``foreign_action_payloads``);
- a token scoped to one project sees nothing of the caller's other projects;
- a list runs the same number of SQL queries for 2 objects as for 12.

``tests/test_isolation_coverage.py`` fails when an endpoint on the project router has no
subclass of this contract.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tenants.choices import Role
from tests.factories import UserFactory, add_member

ALL_ROLES = [Role.READER, Role.MEMBER, Role.ADMIN, Role.OWNER]


@pytest.mark.django_db
class ProjectEndpointContract:
    #: router basename, e.g. "project-member"
    basename: str = ""
    read_role: str = Role.READER
    write_role: str = Role.MEMBER
    #: a singleton endpoint (one object per project, read at the list URL)
    singleton: bool = False
    #: actions the endpoint offers; a contract checks only these
    actions: tuple[str, ...] = ("list", "retrieve", "create", "update", "delete")
    #: the field of a list item that identifies it (compared with ``lookup``)
    id_field: str = "id"
    #: routes on one object beyond CRUD, as (HTTP method, URL suffix): e.g. ("post",
    #: "reset/"). Another project's object answers 404 there exactly like a missing one.
    object_actions: tuple[tuple[str, str], ...] = ()
    #: the create takes no object of a project (only names and sizes): nothing to refuse.
    #: A contract with a create must say so, or give ``foreign_payloads``.
    create_references_nothing: bool = False

    # --- what a concrete contract provides ------------------------------------------------------

    def make_object(self, project):
        """Create one object of this endpoint in ``project``."""
        raise NotImplementedError

    def lookup(self, obj) -> str:
        """The URL value that finds ``obj`` (and the value of ``id_field`` in a list)."""
        return str(obj.pk)

    def create_payload(self, project) -> dict:
        raise NotImplementedError

    def update_payload(self, obj) -> dict:
        raise NotImplementedError

    def foreign_payloads(self, project, other) -> list[dict]:
        """Create payloads that reference objects of ``other``: each must be refused."""
        return []

    def foreign_action_payloads(self, obj, other) -> list[tuple[str, str, dict]]:
        """(HTTP method, URL suffix, payload) of actions on ``obj`` (of the contract's
        project) that name objects of ``other``: each must be refused with 400 or 404."""
        return []

    def count(self, project) -> int:
        """How many objects of this endpoint ``project`` has (to see that nothing was made)."""
        raise NotImplementedError

    missing_lookup = "999999999"

    # --- URLs -----------------------------------------------------------------------------------

    def list_url(self, project_slug):
        return reverse(f"api:{self.basename}-list", kwargs={"project_slug": project_slug})

    def detail_url(self, project_slug, lookup):
        kwarg = self._lookup_kwarg()
        return reverse(
            f"api:{self.basename}-detail", kwargs={"project_slug": project_slug, kwarg: lookup}
        )

    def _lookup_kwarg(self):
        from controlplane.api.urls import project_router

        for _prefix, viewset, basename in project_router.registry:
            if basename == self.basename:
                return viewset.lookup_url_kwarg or viewset.lookup_field
        raise AssertionError(f"no endpoint {self.basename} on the project router")

    def item_id(self, item: dict) -> str:
        """The identity of a list item, comparable with ``lookup``."""
        return str(item[self.id_field])

    def _ids(self, response):
        return {self.item_id(item) for item in response.json()["results"]}

    def _do(self, client, action, project_slug, obj=None, payload=None):
        if action == "list":
            return client.get(self.list_url(project_slug))
        if action == "create":
            return client.post(self.list_url(project_slug), payload or {}, format="json")
        url = self.detail_url(
            project_slug, self.lookup(obj) if obj is not None else self.missing_lookup
        )
        if action == "retrieve":
            return client.get(url)
        if action == "update":
            return client.patch(url, payload or {}, format="json")
        if action == "delete":
            return client.delete(url)
        raise AssertionError(action)

    # --- the contract ---------------------------------------------------------------------------

    def test_anonymous_is_401(self, client_for, project):
        response = client_for(None).get(self.list_url(project.slug))
        assert response.status_code == 401
        assert response.json()["code"] == "not_authenticated"

    def test_outsider_sees_404_like_a_missing_project(self, client_for, project):
        outsider = client_for(UserFactory())
        missing = self._do(outsider, "list", "no-such-project")
        assert missing.status_code == 404
        obj = None if self.singleton else self.make_object(project)
        for action in self.actions:
            payload = None
            if action == "create":
                payload = self.create_payload(project)
            elif action == "update":
                payload = self.update_payload(obj)
            response = self._do(outsider, action, project.slug, obj, payload)
            assert response.status_code == 404, (action, response.content)
            assert response.json() == missing.json(), action

    def test_list_shows_only_this_project(self, client_for, project, other_project):
        if "list" not in self.actions or self.singleton:
            pytest.skip("no list of objects")
        mine, theirs = self.make_object(project), self.make_object(other_project)
        response = client_for(project.owner).get(self.list_url(project.slug), {"page_size": 500})
        assert response.status_code == 200
        ids = self._ids(response)
        assert self.lookup(mine) in ids
        assert self.lookup(theirs) not in ids

    def test_other_projects_object_is_404_like_a_missing_one(
        self, client_for, project, other_project
    ):
        if self.singleton or "retrieve" not in self.actions:
            pytest.skip("no object URLs")
        theirs = self.make_object(other_project)
        client = client_for(project.owner)
        missing = self._do(client, "retrieve", project.slug, None)
        assert missing.status_code == 404
        for action in ("retrieve", "update", "delete"):
            if action not in self.actions:
                continue
            payload = self.update_payload(theirs) if action == "update" else None
            response = self._do(client, action, project.slug, theirs, payload)
            assert response.status_code == 404, (action, response.content)
            assert response.json() == missing.json()
        for method, suffix in self.object_actions:
            missing_here = getattr(client, method)(
                self.detail_url(project.slug, self.missing_lookup) + suffix
            )
            response = getattr(client, method)(
                self.detail_url(project.slug, self.lookup(theirs)) + suffix
            )
            assert missing_here.status_code == 404, (suffix, missing_here.content)
            assert response.status_code == 404, (suffix, response.content)
            assert response.json() == missing_here.json()
        # and it is untouched: its own project still sees it
        again = client_for(other_project.owner).get(
            self.detail_url(other_project.slug, self.lookup(theirs))
        )
        assert again.status_code == 200

    @pytest.mark.parametrize("role", ALL_ROLES)
    def test_role_may_read(self, client_for, project, role):
        user = project.owner if role == Role.OWNER else add_member(project, role=role)
        client = client_for(user)
        allowed = Role.at_least(role, self.read_role)
        response = self._do(client, "list", project.slug)
        assert response.status_code == (200 if allowed else 403), response.content
        if "retrieve" in self.actions and not self.singleton:
            response = self._do(client, "retrieve", project.slug, self.make_object(project))
            assert response.status_code == (200 if allowed else 403), response.content

    @pytest.mark.parametrize("role", ALL_ROLES)
    def test_role_may_write(self, client_for, project, role):
        user = project.owner if role == Role.OWNER else add_member(project, role=role)
        client = client_for(user)
        allowed = Role.at_least(role, self.write_role)
        writes = [a for a in ("create", "update", "delete") if a in self.actions]
        if not writes:
            for method in ("post", "put", "patch", "delete"):
                response = getattr(client, method)(self.list_url(project.slug), {}, format="json")
                assert response.status_code in (403, 405), (method, response.content)
            return
        for action in writes:
            obj = self.make_object(project) if action != "create" else None
            payload = (
                self.create_payload(project)
                if action == "create"
                else self.update_payload(obj)
                if action == "update"
                else None
            )
            response = self._do(client, action, project.slug, obj, payload)
            if allowed:
                assert response.status_code in (200, 201, 202, 204), (action, response.content)
            else:
                assert response.status_code == 403, (action, response.content)
                assert response.json()["code"] == "permission_denied"

    def test_create_with_foreign_references_is_refused(self, client_for, project, other_project):
        if "create" not in self.actions:
            pytest.skip("no create")
        client = client_for(project.owner)
        payloads = self.foreign_payloads(project, other_project)
        assert payloads or self.create_references_nothing, (
            f"{type(self).__name__}: give foreign_payloads, or set create_references_nothing"
        )
        for payload in payloads:
            before = (self.count(project), self.count(other_project))
            response = self._do(client, "create", project.slug, payload=payload)
            assert response.status_code in (400, 404), (payload, response.content)
            assert (self.count(project), self.count(other_project)) == before

    def test_actions_naming_another_projects_objects_are_refused(
        self, client_for, project, other_project
    ):
        mine = self.make_object(project) if "retrieve" in self.actions else None
        cases = self.foreign_action_payloads(mine, other_project) if mine is not None else []
        if not cases:
            pytest.skip("no action names another object")
        client = client_for(project.owner)
        for method, suffix, payload in cases:
            url = self.detail_url(project.slug, self.lookup(mine)) + suffix
            response = getattr(client, method)(url, payload, format="json")
            assert response.status_code in (400, 404), (suffix, payload, response.content)

    def test_scoped_token_sees_only_its_project(self, client_for, project, other_project):
        user = UserFactory()
        add_member(project, user, role=Role.OWNER)
        add_member(other_project, user, role=Role.OWNER)
        scoped = client_for(user, project=other_project)
        assert self._do(scoped, "list", other_project.slug).status_code == 200
        assert self._do(scoped, "list", project.slug).status_code == 404

    def test_list_runs_constant_queries(self, client_for, project):
        if self.singleton or "list" not in self.actions:
            pytest.skip("no list of objects")
        client = client_for(project.owner)
        url = self.list_url(project.slug)
        client.get(url)  # warm caches (content types, token last-used write)

        def queries():
            with CaptureQueriesContext(connection) as ctx:
                assert client.get(url, {"page_size": 100}).status_code == 200
            return len(ctx.captured_queries)

        self.make_object(project)
        self.make_object(project)
        few = queries()
        for _ in range(10):
            self.make_object(project)
        assert queries() == few
