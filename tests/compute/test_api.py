"""The operators' host endpoints."""

import pytest
from django.utils import timezone

from compute import services
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def host():
    return services.host_heartbeat(host="gpu-07", payload={}, sent_at=timezone.now())


def test_hosts_are_for_operators_only(client_for, host):
    assert client_for(UserFactory()).get("/api/v1/admin/hosts/").status_code == 403


def test_operator_drains_a_host(client_for, staff, host):
    api = client_for(staff)
    response = api.post("/api/v1/admin/hosts/gpu-07/state/", {"state": "draining"}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "draining"
    listed = api.get("/api/v1/admin/hosts/", {"state": "draining"}).json()
    assert [h["name"] for h in listed["results"]] == ["gpu-07"]


def test_returning_an_up_host_to_service_is_a_409_naming_its_state(client_for, staff, host):
    response = client_for(staff).post(
        "/api/v1/admin/hosts/gpu-07/state/", {"state": "up"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["details"] == {"state": ["up"]}


def test_ping_answers_202_with_the_operation(client_for, staff, host):
    response = client_for(staff).post("/api/v1/admin/hosts/gpu-07/ping/")
    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "pending" and body["kind"] == "host.ping"
    assert response.headers["Location"] == body["url"]
    assert client_for(staff).get(body["url"]).json()["id"] == body["id"]
