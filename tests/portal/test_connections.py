"""External connections in the portal: a project's admins request one (as in the API) and
everyone in the project sees its state; operators approve or reject on
``/fleet/connections/``, a page that does not exist for anyone else."""

import pytest
from django.urls import reverse

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from network import services as network
from network.choices import ConnectionKind, ConnectionState
from network.models import ExternalConnection
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_network, make_pool, make_project

pytestmark = pytest.mark.django_db


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def route(project, name="campus"):
    return network.connection_request(
        project=project,
        name=name,
        kind=ConnectionKind.L3_ROUTE,
        destination_cidr="172.16.0.0/16",
        next_hop="10.1.0.254",
    )


def test_an_admin_requests_a_connection(login, project, users_by_role):
    response = login(users_by_role[Role.ADMIN]).post(
        url("connections", project),
        {
            "name": "campus",
            "kind": ConnectionKind.L3_ROUTE,
            "destination_cidr": "172.16.0.0/16",
            "next_hop": "10.1.0.254",
            "remote": "the campus LAN",
        },
    )
    assert response.status_code == 302
    connection = ExternalConnection.objects.for_project(project).get(name="campus")
    assert connection.state == ConnectionState.REQUESTED
    assert (
        AuditEvent.objects.for_project(project)
        .filter(action="external_connection.request", outcome=AuditOutcome.SUCCESS)
        .exists()
    )
    html = login(users_by_role[Role.READER]).get(url("connections", project)).content.decode()
    assert "campus" in html and "Requested" in html
    assert 'id="connection-request"' not in html


def test_an_l2vpn_names_its_network(login, project, users_by_role):
    net = make_network(project, "hpc", cidr="10.4.0.0/24")
    response = login(project.owner).post(
        url("connections", project),
        {"name": "to-hpc", "kind": ConnectionKind.L2VPN, "network": net.pk, "vlan_id": 120},
    )
    assert response.status_code == 302
    assert ExternalConnection.objects.get(name="to-hpc").network == net


@pytest.mark.parametrize(
    "data, field",
    [
        ({"name": "Bad!", "kind": "l3_route"}, "name"),
        ({"name": "x", "kind": "teleport"}, "kind"),
        ({"name": "x", "kind": "l2vpn"}, "vlan_id"),
        ({"name": "x", "kind": "l2vpn", "vlan_id": 5000}, "vlan_id"),
        ({"name": "x", "kind": "l3_route", "destination_cidr": "10.0.0.0/8"}, "next_hop"),
        (
            {"name": "x", "kind": "l3_route", "destination_cidr": "nope", "next_hop": "1.2.3.4"},
            "destination_cidr",
        ),
        ({"name": "x", "kind": "l2vpn", "network": 999999, "vlan_id": 5}, "network"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(login, project, users_by_role, data, field):
    response = login(users_by_role[Role.ADMIN]).post(url("connections", project), data)
    assert response.status_code == 400
    assert f'data-field="{field}"' in response.content.decode()
    assert not ExternalConnection.objects.exists()


def test_a_name_taken_is_a_409_on_the_name(login, project, users_by_role):
    route(project)
    response = login(users_by_role[Role.ADMIN]).post(
        url("connections", project),
        {
            "name": "campus",
            "kind": "l3_route",
            "destination_cidr": "10.0.0.0/8",
            "next_hop": "1.2.3.4",
        },
    )
    assert response.status_code == 409
    assert 'data-field="name"' in response.content.decode()


@pytest.mark.parametrize("role", [Role.MEMBER, Role.READER])
def test_below_admin_cannot_request_or_delete(login, project, users_by_role, role):
    connection = route(project)
    client = login(users_by_role[role])
    assert client.get(url("connections", project)).status_code == 200
    response = client.post(url("connections", project), {"name": "x", "kind": "site_vpn"})
    assert response.status_code == 403
    assert client.post(url("connection-delete", project, pk=connection.pk)).status_code == 403
    assert ExternalConnection.objects.filter(pk=connection.pk).exists()


def test_an_admin_deletes_a_connection(login, project, users_by_role):
    connection = route(project)
    response = login(users_by_role[Role.ADMIN]).post(
        url("connection-delete", project, pk=connection.pk)
    )
    assert response.status_code == 302
    assert not ExternalConnection.objects.filter(pk=connection.pk).exists()


def test_outsiders_get_404(login, project):
    assert login(make_project().owner).get(url("connections", project)).status_code == 404


# --- operators ----------------------------------------------------------------------------


def test_operators_approve_and_reject(login, staff, project, other_project):
    make_pool()  # an approved L3 route goes through the project's router
    Quota.objects.filter(project=project).update(global_ips=5)
    first, second = route(project), route(other_project, "lab")
    client = login(staff)
    html = client.get(reverse("portal:fleet-connections")).content.decode()
    assert f"{project.slug}/campus" in html and f"{other_project.slug}/lab" in html
    response = client.post(
        reverse("portal:connection-review", kwargs={"pk": first.pk, "verdict": "approve"}),
        {"note": "ok"},
    )
    assert response.status_code == 302
    first.refresh_from_db()
    assert first.state == ConnectionState.APPROVED
    assert first.reviewed_by == staff and first.review_note == "ok"
    client.post(reverse("portal:connection-review", kwargs={"pk": second.pk, "verdict": "reject"}))
    second.refresh_from_db()
    assert second.state == ConnectionState.REJECTED
    assert AuditEvent.objects.filter(action="external_connection.approve", actor=staff).exists()
    assert AuditEvent.objects.filter(action="external_connection.reject", actor=staff).exists()


def test_reviewing_twice_is_refused_and_audited(login, staff, project):
    connection = route(project)
    network.connection_review(connection=connection, approve=False)
    response = login(staff).post(
        reverse("portal:connection-review", kwargs={"pk": connection.pk, "verdict": "approve"}),
        follow=True,
    )
    assert response.status_code == 200
    assert "rejected already" in response.content.decode()
    connection.refresh_from_db()
    assert connection.state == ConnectionState.REJECTED
    refusal = AuditEvent.objects.get(action="portal.connection_review")
    assert refusal.outcome == AuditOutcome.FAILED
    assert refusal.detail["status"] == 409
    assert refusal.object_id == str(connection.pk)


def test_a_note_too_long_is_refused(login, staff, project):
    connection = route(project)
    login(staff).post(
        reverse("portal:connection-review", kwargs={"pk": connection.pk, "verdict": "approve"}),
        {"note": "x" * 501},
    )
    connection.refresh_from_db()
    assert connection.state == ConnectionState.REQUESTED


@pytest.mark.parametrize("role", [Role.OWNER, Role.READER])
def test_the_operators_page_is_404_for_everyone_else(login, project, users_by_role, role):
    connection = route(project)
    client = login(users_by_role[role])
    assert client.get(reverse("portal:fleet-connections")).status_code == 404
    response = client.post(
        reverse("portal:connection-review", kwargs={"pk": connection.pk, "verdict": "approve"})
    )
    assert response.status_code == 404
    connection.refresh_from_db()
    assert connection.state == ConnectionState.REQUESTED
