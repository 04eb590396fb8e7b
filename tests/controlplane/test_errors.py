"""controlplane/api/errors.py: one error body, {status, code, message, details}, everywhere."""

import pytest
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from django.test import Client
from rest_framework import exceptions

from controlplane.api.errors import exception_handler
from controlplane.errors import Conflict, InvalidInput, QuotaExceeded
from tenants.choices import Role
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

SHAPE = {"status", "code", "message", "details"}


def _assert_error(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == SHAPE
    assert (body["status"], body["code"]) == (status, code)
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["details"], dict)
    return body


def test_400_names_the_field(client_for, staff):
    response = client_for(staff).post("/api/v1/projects/", {"slug": "Bad Slug"})
    body = _assert_error(response, 400, "invalid")
    assert set(body["details"]) == {"slug", "name"}
    assert body["details"]["name"] == ["This field is required."]
    assert body["message"].split(":")[0] in {"slug", "name"}


def test_400_for_a_body_that_is_not_json(client_for, staff):
    response = client_for(staff).post(
        "/api/v1/projects/", "{not json", content_type="application/json"
    )
    _assert_error(response, 400, "parse_error")


def test_401_without_credentials():
    response = Client().get("/api/v1/projects/")
    _assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'


def test_401_with_a_bad_token():
    response = Client().get("/api/v1/projects/", HTTP_AUTHORIZATION="Bearer kumo_abc_def")
    body = _assert_error(response, 401, "authentication_failed")
    assert body["message"] == "Invalid token."


def test_403_names_the_role_needed(client_for, users_by_role, project):
    response = client_for(users_by_role[Role.READER]).post(
        f"/api/v1/projects/{project.slug}/invitations/", {"email": "x@uni.example.ac.jp"}
    )
    body = _assert_error(response, 403, "permission_denied")
    assert body["message"] == (
        f"your role in project {project.slug} is reader; this needs admin or above"
    )


def test_404_for_a_missing_object(client_for, project):
    response = client_for(project.owner).get(f"/api/v1/projects/{project.slug}/members/nobody/")
    body = _assert_error(response, 404, "not_found")
    assert body["details"] == {}


def test_405_for_a_method_the_endpoint_lacks(client_for, project):
    url = f"/api/v1/projects/{project.slug}/members/{project.owner.username}/"
    response = client_for(project.owner).put(url, {"role": "reader"})
    _assert_error(response, 405, "method_not_allowed")


def test_409_carries_a_specific_code(client_for, project):
    url = f"/api/v1/projects/{project.slug}/members/{project.owner.username}/"
    body = _assert_error(client_for(project.owner).delete(url), 409, "last_owner")
    assert body["message"] == "a project keeps at least one owner"


@pytest.mark.parametrize(
    "path", ["/api/v1/no-such-thing/", "/api/nothing", "/api/v1/projects/a/b/c/d/"]
)
def test_an_unknown_api_url_is_a_json_404(path):
    _assert_error(Client().get(path), 404, "not_found")


def test_an_unknown_portal_url_is_an_html_404():
    response = Client().get("/no-such-page/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


# --- the handler, exception by exception ----------------------------------------------------


def _handle(exc):
    response = exception_handler(exc, {"view": None, "request": None})
    return response.status_code, response.data, response


@pytest.mark.parametrize(
    ("exc", "status", "code", "message", "details"),
    [
        (
            InvalidInput.field("cidr", "overlaps 10.0.0.0/24"),
            400,
            "invalid",
            "cidr: overlaps 10.0.0.0/24",
            {"cidr": ["overlaps 10.0.0.0/24"]},
        ),
        (Conflict("vm is running", code="vm_running"), 409, "vm_running", "vm is running", {}),
        (
            QuotaExceeded("over", details={"vms": ["x"]}),
            409,
            "quota_exceeded",
            "over",
            {"vms": ["x"]},
        ),
        (Http404("gone"), 404, "not_found", "Not found.", {}),
        (
            DjangoPermissionDenied(),
            403,
            "permission_denied",
            "You do not have permission to do this.",
            {},
        ),
        (
            DjangoValidationError({"name": ["too long"]}),
            400,
            "invalid",
            "name: too long",
            {"name": ["too long"]},
        ),
        (
            DjangoValidationError("plain"),
            400,
            "invalid",
            "plain",
            {"non_field_errors": ["plain"]},
        ),
        (
            exceptions.ValidationError({"rules": [{}, {"port": ["must be 1-65535"]}]}),
            400,
            "invalid",
            "rules: [1].port: must be 1-65535",
            {"rules": [{}, {"port": ["must be 1-65535"]}]},
        ),
        (
            exceptions.ValidationError(["whole request bad"]),
            400,
            "invalid",
            "whole request bad",
            {"non_field_errors": ["whole request bad"]},
        ),
        (exceptions.NotFound(), 404, "not_found", "Not found.", {}),
    ],
)
def test_handler_maps_each_exception(exc, status, code, message, details):
    got_status, body, _ = _handle(exc)
    assert got_status == status
    assert body == {"status": status, "code": code, "message": message, "details": details}


def test_handler_says_when_to_retry_a_throttled_request():
    status, body, response = _handle(exceptions.Throttled(wait=12.4))
    assert (status, body["code"]) == (429, "throttled")
    assert response["Retry-After"] == "13"  # DRF rounds the wait up


def test_handler_leaves_a_bug_to_django():
    assert exception_handler(KeyError("bug"), {"view": None, "request": None}) is None


def test_a_refused_write_is_answered_even_when_its_audit_fails(client_for, staff, monkeypatch):
    from controlplane import audit

    def broken(*args, **kwargs):
        raise RuntimeError("audit table unavailable")

    client = client_for(staff)
    monkeypatch.setattr(audit, "record", broken)
    response = client.post("/api/v1/projects/", {"slug": "Bad Slug", "name": "x"})
    _assert_error(response, 400, "invalid")


def test_a_non_staff_user_gets_403_json_on_operator_endpoints(client_for):
    response = client_for(UserFactory()).get("/api/v1/admin/projects/")
    _assert_error(response, 403, "permission_denied")
