"""The network API as a client sees it: answers, errors naming their field, statuses."""

import pytest
from django.urls import reverse

from network.models import HostNetwork
from tests.factories import (
    add_member,
    enroll_network,
    make_host,
    make_image,
    make_network,
    make_pool,
    make_template,
)

pytestmark = pytest.mark.django_db


def url(project, name, **kwargs):
    return reverse(f"api:project-{name}-list", kwargs={"project_slug": project.slug, **kwargs})


@pytest.fixture
def api(client_for, project):
    return client_for(add_member(project))


def test_a_network_with_a_subnet_in_one_request(api, project):
    r = api.post(url(project, "network"), {"name": "lab", "cidr": "10.20.0.0/24"}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["mtu"] == 1450 and body["kind"] == "overlay" and body["vni"] >= 10000
    subnets = api.get(url(project, "subnet")).json()["results"]
    assert [(s["cidr"], s["gateway_ip"], s["pool_start"]) for s in subnets] == [
        ("10.20.0.0/24", "10.20.0.1", "10.20.0.2")
    ]


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": "lab", "cidr": "10.20.0.5/24"}, "cidr"),
        ({"name": "lab", "kind": "token-ring"}, "kind"),
    ],
)
def test_bad_networks_are_400_naming_the_field(api, project, payload, field):
    r = api.post(url(project, "network"), payload, format="json")
    assert r.status_code == 400 and field in r.json()["details"], r.content


def test_overlapping_subnet_and_exhausted_addresses(api, project):
    make_network(project, "lab", cidr="10.1.0.0/29")
    r = api.post(url(project, "subnet"), {"network": "lab", "cidr": "10.1.0.0/28"}, format="json")
    assert r.status_code == 400 and "cidr" in r.json()["details"]
    for _ in range(5):
        assert api.post(url(project, "port"), {"network": "lab"}, format="json").status_code == 201
    r = api.post(url(project, "port"), {"network": "lab"}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "exhausted"


def test_rdma_without_sriov_is_refused_with_the_reason(api, project):
    r = api.post(url(project, "network"), {"name": "roce", "kind": "rdma"}, format="json")
    assert r.status_code == 409
    assert r.json()["code"] == "rdma_unavailable" and "SR-IOV" in r.json()["message"]


def test_a_vm_with_a_nic_shows_it_and_its_port_turns_active(api, project):
    host = make_host("api-h1")
    enroll_network(host, "10.99.0.1")
    make_network(project, "lab", cidr="10.20.0.0/24")
    payload = {
        "name": "web-1",
        "template": make_template(gpus=1).name,
        "image": make_image().pk,
        "nics": [{"network": "lab", "fixed_ip": "10.20.0.50"}],
    }
    r = api.post(url(project, "vm"), payload, format="json")
    assert r.status_code == 202, r.content
    (nic,) = r.json()["nics"]
    assert nic["network"] == "lab" and nic["fixed_ips"] == ["10.20.0.50"]
    port = api.get(url(project, "port")).json()["results"][0]
    assert port["status"] == "down" and port["host"] == "api-h1"
    row = HostNetwork.objects.get(host=host)
    enroll_network(host, "10.99.0.1", applied_generation=row.desired_generation)
    port = api.get(url(project, "port")).json()["results"][0]
    assert port["status"] == "active"


def test_a_nic_on_a_missing_network_is_400(api, project):
    payload = {
        "name": "web-1",
        "template": make_template().name,
        "image": make_image().pk,
        "nics": [{"network": "nowhere"}],
    }
    r = api.post(url(project, "vm"), payload, format="json")
    assert r.status_code == 400 and "nics" in r.json()["details"]


def test_open_a_port_forward_and_see_it_go_with_the_port(api, project):
    make_pool()
    make_network(project, "lab", cidr="10.20.0.0/24", external_access=True)
    port = api.post(url(project, "port"), {"network": "lab"}, format="json").json()
    address = api.post(url(project, "globalip"), {}, format="json").json()["address"]
    forward = {
        "global_ip": address,
        "protocol": "tcp",
        "external_port": 8022,
        "port": port["id"],
        "internal_port": 22,
    }
    assert api.post(url(project, "portforward"), forward, format="json").status_code == 201
    again = api.post(url(project, "portforward"), forward, format="json")
    assert again.status_code == 409
    detail = reverse(
        "api:project-port-detail", kwargs={"project_slug": project.slug, "pk": port["id"]}
    )
    assert api.delete(detail).status_code == 204
    assert api.get(url(project, "portforward")).json()["count"] == 0


def test_operators_approve_connections_and_see_host_networks(client_for, staff, project):
    admin = client_for(staff)
    r = admin.post(
        reverse("api:admin-globalippool-list"),
        {"name": "campus", "cidr": "198.51.100.0/24", "gateway_ip": "198.51.100.1"},
        format="json",
    )
    assert r.status_code == 201, r.content
    bad = admin.post(
        reverse("api:admin-globalippool-list"),
        {"name": "x", "cidr": "198.51.100.0/25", "gateway_ip": "198.51.100.1"},
        format="json",
    )
    assert bad.status_code == 400 and "cidr" in bad.json()["details"]

    owner = client_for(project.owner)
    make_network(project, "lab")
    enroll_network(make_host("gw-1", kind="cpu"), "10.99.0.9", gateway=True, trunk_device="bond0")
    c = owner.post(
        url(project, "externalconnection"),
        {"name": "to-hpc", "kind": "l2vpn", "network": "lab", "vlan_id": 300},
        format="json",
    ).json()
    assert c["state"] == "requested"
    r = admin.post(reverse("api:admin-externalconnection-approve", kwargs={"pk": c["id"]}), {})
    assert r.status_code == 200 and r.json()["state"] == "approved"
    again = admin.post(reverse("api:admin-externalconnection-reject", kwargs={"pk": c["id"]}), {})
    assert again.status_code == 409

    hosts = admin.get(reverse("api:admin-hostnetwork-list")).json()["results"]
    assert [(h["host"], h["gateway"]) for h in hosts] == [("gw-1", True)]
    r = admin.post(reverse("api:admin-hostnetwork-resync", kwargs={"host": "gw-1"}))
    assert r.status_code == 202


def test_a_subnets_dns_servers_are_set_and_cleared(api, project):
    """PATCH dns_servers: the guests are told those servers (no search domain); [] goes
    back to the network's own resolver with the project's zone."""
    from network import dns
    from network.models import Subnet

    net = make_network(project, "names", cidr="10.44.0.0/24")
    subnet = Subnet.objects.get(network=net)
    client = api
    url = f"/api/v1/projects/{project.slug}/subnets/{subnet.pk}/"
    assert dns.guest_dns(subnet, net, project.slug) == (("10.44.0.1",), (dns.zone(project.slug),))
    answer = client.patch(url, {"dns_servers": ["9.9.9.9", "1.1.1.1"]}, format="json")
    assert answer.status_code == 200 and answer.json()["dns_servers"] == ["9.9.9.9", "1.1.1.1"]
    subnet.refresh_from_db()
    assert dns.guest_dns(subnet, net, project.slug) == (("9.9.9.9", "1.1.1.1"), ())
    bad = client.patch(url, {"dns_servers": ["resolver"]}, format="json")
    assert bad.status_code == 400 and "dns_servers" in bad.json()["details"]
    empty = client.patch(url, {}, format="json")
    assert empty.status_code == 400 and "dns_servers" in empty.json()["details"]
    assert client.patch(url, {"dns_servers": []}, format="json").status_code == 200
    subnet.refresh_from_db()
    assert dns.guest_dns(subnet, net, project.slug)[0] == ("10.44.0.1",)
