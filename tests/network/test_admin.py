"""The admin console for networks: every page renders for an operator at a cost that does not
grow with its rows, nothing is edited by hand, and what operators do (pools, connection
reviews, resending a host its state) goes through the services and is audited."""

import itertools

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from controlplane.models import AuditEvent
from network import services
from network.choices import ConnectionKind, ConnectionState, Direction, PortBinding, Protocol
from network.models import (
    ExternalConnection,
    GlobalIp,
    GlobalIpPool,
    HostNetwork,
    Network,
    Port,
    PortForward,
    Router,
    SecurityGroup,
    Subnet,
)
from tests.factories import (
    UserFactory,
    enroll_network,
    make_host,
    make_network,
    make_pool,
    make_project,
)

pytestmark = pytest.mark.django_db

MODELS = [
    Network,
    Subnet,
    Port,
    SecurityGroup,
    GlobalIpPool,
    GlobalIp,
    PortForward,
    Router,
    ExternalConnection,
    HostNetwork,
]

_world_seq = itertools.count(1)


def make_world():
    """One project's worth of every network object, and a gateway host and pool of its own:
    a network with a subnet, a port bound to the host, a security group with a rule, a router
    with its address, a 1:1 NAT address, a forwarded address, and a requested connection."""
    n = next(_world_seq)
    host = make_host(f"net-{n:02d}")
    enroll_network(host, f"10.250.0.{n}", gateway=True)
    make_pool(name=f"pool-{n}", cidr=f"198.18.{n}.0/24", gateway_ip=f"198.18.{n}.1")
    project = make_project()
    network = make_network(project, "lab", external_access=True)
    port = services.port_create(
        network=network, host=host, binding=PortBinding.VETH, binding_netns=f"ns{n}"
    )
    group = services.security_group_create(project=project, name="ssh")
    services.rule_create(
        group=group, direction=Direction.INGRESS, protocol=Protocol.TCP, port_min=22
    )
    nat = services.global_ip_allocate(project=project)
    services.global_ip_associate(address=nat, port=port)
    forwarded = services.global_ip_allocate(project=project)
    services.port_forward_create(
        address=forwarded, protocol="tcp", external_port=2222, port=port, internal_port=22
    )
    connection = services.connection_request(
        project=project,
        name="supercomputer",
        kind=ConnectionKind.L3_ROUTE,
        destination_cidr="172.16.0.0/16",
        next_hop="192.168.10.254",
    )
    return {
        "host": host,
        "project": project,
        "network": network,
        "port": port,
        "group": group,
        "connection": connection,
    }


@pytest.fixture
def console(client, staff):
    client.force_login(staff)
    return client


def _url(model, view, *args):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_network_page_renders_with_rows(console, model):
    make_world()
    objects = list(model.objects.all())
    assert objects, f"the world has no {model.__name__}"
    response = console.get(_url(model, "changelist"))
    assert response.status_code == 200
    assert response.context["cl"].result_count == len(objects)
    for obj in objects:
        assert console.get(_url(model, "change", obj.pk)).status_code == 200


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_list_pages_cost_the_same_queries_however_many_rows(console, model):
    make_world()

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert console.get(_url(model, "changelist")).status_code == 200
        return len(captured)

    one = queries()
    make_world()
    make_world()
    assert model.objects.count() >= 3
    assert queries() == one


def test_search_finds_a_port_by_its_address(console):
    world = make_world()
    address = world["port"].fixed_ips.get().address
    response = console.get(_url(Port, "changelist"), {"q": address})
    assert [p.pk for p in response.context["cl"].result_list] == [world["port"].pk]


def test_objects_are_not_added_changed_or_deleted_by_hand(console):
    world = make_world()
    assert console.get(_url(Network, "add")).status_code == 403
    response = console.post(_url(Network, "change", world["network"].pk), {"name": "renamed"})
    assert response.status_code == 403
    assert console.post(_url(Port, "delete", world["port"].pk), {"post": "yes"}).status_code == 403
    assert Port.objects.filter(pk=world["port"].pk).exists()
    pool = GlobalIpPool.objects.first()
    response = console.post(_url(GlobalIpPool, "change", pool.pk), {"name": "renamed"})
    assert response.status_code == 403


def test_a_pool_is_added_through_the_service_and_audited(console):
    assert console.get(_url(GlobalIpPool, "add")).status_code == 200
    response = console.post(
        _url(GlobalIpPool, "add"),
        {"name": "campus", "cidr": "203.0.113.0/24", "gateway_ip": "203.0.113.1"},
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    pool = GlobalIpPool.objects.get(name="campus")
    assert (pool.pool_start, pool.pool_end) == ("203.0.113.1", "203.0.113.254")
    event = AuditEvent.objects.get(action="global_ip_pool.create", object_id=str(pool.pk))
    assert event.source == "admin"


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"cidr": "203.0.113.7/24", "gateway_ip": "203.0.113.1"}, "cidr"),  # host bits set
        ({"cidr": "not-a-network", "gateway_ip": "203.0.113.1"}, "cidr"),
        ({"cidr": "203.0.113.0/24", "gateway_ip": "192.0.2.1"}, "gateway_ip"),
        ({"cidr": "198.51.100.128/25", "gateway_ip": "198.51.100.129"}, "cidr"),  # overlaps
    ],
)
def test_a_bad_pool_is_a_form_error_not_a_500(console, fields, field):
    make_pool()  # campus, 198.51.100.0/24
    response = console.post(_url(GlobalIpPool, "add"), {"name": "second", **fields})
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not GlobalIpPool.objects.filter(name="second").exists()


def test_a_taken_pool_name_is_a_form_error(console):
    make_pool()
    response = console.post(
        _url(GlobalIpPool, "add"),
        {"name": "campus", "cidr": "203.0.113.0/24", "gateway_ip": "203.0.113.1"},
    )
    assert response.status_code == 200
    assert "name" in response.context["adminform"].form.errors
    assert GlobalIpPool.objects.count() == 1


def test_a_pool_is_deleted_through_the_service_and_audited(console):
    pool = make_pool()
    response = console.post(_url(GlobalIpPool, "delete", pool.pk), {"post": "yes"})
    assert response.status_code == 302
    assert not GlobalIpPool.objects.filter(pk=pool.pk).exists()
    assert AuditEvent.objects.filter(action="global_ip_pool.delete", source="admin").exists()


def test_a_pool_with_addresses_given_out_is_not_deleted(console):
    make_world()
    pool = GlobalIpPool.objects.get()
    response = console.post(
        _url(GlobalIpPool, "changelist"),
        {"action": "delete_selected", "_selected_action": [pool.pk], "post": "yes"},
    )
    assert response.status_code == 200  # Django lists the protected addresses instead
    assert GlobalIpPool.objects.filter(pk=pool.pk).exists()


def _review(console, action, connection):
    return console.post(
        _url(ExternalConnection, "changelist"),
        {"action": action, "_selected_action": [connection.pk]},
    )


def test_approving_a_connection_goes_through_the_service_and_is_audited(console, staff):
    world = make_world()
    response = _review(console, "approve", world["connection"])
    assert response.status_code == 302
    connection = ExternalConnection.objects.get(pk=world["connection"].pk)
    assert connection.state == ConnectionState.APPROVED
    assert connection.reviewed_by == staff
    event = AuditEvent.objects.get(
        action="external_connection.approve", object_id=str(connection.pk)
    )
    assert (event.actor, event.source, event.project) == (staff, "admin", world["project"])


def test_rejecting_a_connection_and_reviewing_it_twice(console):
    world = make_world()
    assert _review(console, "reject", world["connection"]).status_code == 302
    world["connection"].refresh_from_db()
    assert world["connection"].state == ConnectionState.REJECTED
    # A second review is refused by the service and shown as a message, not a 500.
    response = _review(console, "approve", world["connection"])
    assert response.status_code == 302
    world["connection"].refresh_from_db()
    assert world["connection"].state == ConnectionState.REJECTED
    messages = [str(m) for m in response.wsgi_request._messages]
    assert any("rejected already" in m for m in messages)
    assert not AuditEvent.objects.filter(action="external_connection.approve").exists()


def test_resend_desired_state_sends_to_the_selected_hosts(console, monkeypatch):
    world = make_world()
    sent = []
    monkeypatch.setattr("network.sync.send_desired", lambda ids: sent.append(list(ids)) or 1)
    row = HostNetwork.objects.get(host=world["host"])
    response = console.post(
        _url(HostNetwork, "changelist"),
        {"action": "resend_desired", "_selected_action": [row.pk]},
    )
    assert response.status_code == 302
    assert sent == [[world["host"].pk]]


def test_a_user_who_is_not_staff_is_refused(client):
    world = make_world()
    client.force_login(UserFactory())
    response = client.get(_url(ExternalConnection, "changelist"))
    assert response.status_code == 302 and "/login/" in response["Location"]
    response = _review(client, "approve", world["connection"])
    assert response.status_code == 302 and "/login/" in response["Location"]
    world["connection"].refresh_from_db()
    assert world["connection"].state == ConnectionState.REQUESTED


def test_the_router_list_shows_its_external_address(console):
    world = make_world()
    address = GlobalIp.objects.get(project=world["project"], router=True).address
    response = console.get(_url(Router, "changelist"))
    assert address in response.content.decode()
