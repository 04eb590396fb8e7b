"""A database connection cut mid-request answers 503 with Retry-After, not 500 (issue 13,
fault 5): on PostgreSQL, another connection kills the request's backend with
``pg_terminate_backend`` just before one of its queries runs."""

import contextlib

import pytest
from django.db import connection, connections
from django.test import Client
from rest_framework.test import APIClient

from tests.factories import UserFactory, make_project, token_for
from tests.pg import second_connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@contextlib.contextmanager
def cut_on(marker: str):
    """Terminate this connection's backend right before the first query containing
    ``marker``; yields the list of queries that met the cut."""
    cut = []

    def wrapper(execute, sql, params, many, context):
        if not cut and marker in sql:
            pid = context["connection"].connection.info.backend_pid
            with second_connection() as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
            cut.append(sql)
        return execute(sql, params, many, context)

    connection.ensure_connection()
    try:
        with connection.execute_wrapper(wrapper):
            yield cut
    finally:
        # What a real server does when the request ends (Django's test client does not):
        # a connection found unusable is dropped, the next request opens a new one.
        connection.close_if_unusable_or_obsolete()


def test_api_request_cut_mid_way_answers_503_with_retry_after():
    user = UserFactory()
    project = make_project(owner=user)
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    with cut_on('"compute_virtualmachine"') as cut:
        response = api.get(f"/api/v1/projects/{project.slug}/vms/")
    assert cut, "the request never reached the VM query"
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    assert response.json()["code"] == "database_unavailable"
    # The next request gets a fresh connection and succeeds.
    assert api.get(f"/api/v1/projects/{project.slug}/vms/").status_code == 200


def test_a_write_cut_mid_way_answers_503_and_commits_nothing():
    user = UserFactory()
    project = make_project(owner=user)
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    with cut_on('INSERT INTO "network_securitygroup"') as cut:
        response = api.post(
            f"/api/v1/projects/{project.slug}/security-groups/", {"name": "web"}, format="json"
        )
    assert cut
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    from network.models import SecurityGroup

    assert not SecurityGroup.objects.filter(project=project, name="web").exists()


def test_portal_page_cut_in_a_middleware_answers_503_with_retry_after():
    user = UserFactory()
    make_project(owner=user)
    browser = Client(raise_request_exception=False)
    browser.force_login(user)
    # The session is read by a middleware, before any view runs.
    with cut_on('"django_session"') as cut:
        response = browser.get("/")
    assert cut
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    assert b"Traceback" not in response.content


def test_a_connection_lost_while_idle_is_replaced_by_the_next_requests_first_read(
    monkeypatch,
):
    """The token lookup, a request's first statement, also checks a kept connection (no
    ``SELECT 1`` before it): when the connection was lost between requests, the lookup opens
    a new one and the request succeeds, as Django's health check would have made it."""
    user = UserFactory()
    project = make_project(owner=user)
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    url = f"/api/v1/projects/{project.slug}/audit-events/"
    assert api.get(url).status_code == 200
    checks = []
    wrapper = connections["default"]
    is_usable = type(wrapper).is_usable
    monkeypatch.setattr(
        type(wrapper), "is_usable", lambda conn: checks.append(1) or is_usable(conn)
    )
    for lost in (False, True):
        connection.close_if_unusable_or_obsolete()  # a request's end, as a real server does
        pid = connection.connection.info.backend_pid
        if lost:
            with second_connection() as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        checks.clear()
        response = api.get(url)
        assert response.status_code == 200, response.content
        assert (connection.connection.info.backend_pid != pid) is lost
        # Django's check (``SELECT 1``) only once the lookup failed, to tell a lost
        # connection from a failing statement.
        assert len(checks) == (1 if lost else 0)
