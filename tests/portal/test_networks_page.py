"""A network's own page (subnets, ports, outbound access, DNS) and global IPs' 1:1 NAT in
the portal: what the forms do is what the services did, audited; readers and outsiders
cannot; bad input is a 400 naming the field."""

import pytest
from django.urls import reverse

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from network import services as network
from network.models import GlobalIp, Port, Subnet
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_network, make_pool, make_project

pytestmark = pytest.mark.django_db


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def audited(project, action):
    return AuditEvent.objects.for_project(project).filter(
        action=action, outcome=AuditOutcome.SUCCESS
    )


@pytest.fixture
def net(project):
    return make_network(project, "lab", cidr="10.1.0.0/24")


def test_the_page_shows_subnets_ports_outbound_and_dns(login, project, users_by_role, net):
    subnet = Subnet.objects.get(network=net)
    network.subnet_update(subnet=subnet, dns_servers=["9.9.9.9"])
    port = network.port_create(network=net, name="probe")
    response = login(users_by_role[Role.READER]).get(url("network-detail", project, pk=net.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert "10.1.0.0/24" in html and "9.9.9.9" in html
    assert port.mac in html and "probe" in html
    assert 'id="outbound"' in html
    assert 'id="subnet-create"' not in html  # readers get no forms
    assert reverse("portal:network-detail", kwargs={"slug": project.slug, "pk": net.pk}) in (
        login(users_by_role[Role.READER]).get(url("networks", project)).content.decode()
    )


def test_a_member_adds_a_subnet(login, project, users_by_role, net):
    response = login(users_by_role[Role.MEMBER]).post(
        url("network-detail", project, pk=net.pk),
        {"form": "subnet", "cidr": "10.1.1.0/24", "name": "second", "dns_servers": "1.1.1.1"},
    )
    assert response.status_code == 302
    subnet = Subnet.objects.get(network=net, cidr="10.1.1.0/24")
    assert subnet.gateway_ip == "10.1.1.1"
    assert subnet.dns_servers == ["1.1.1.1"]
    assert audited(project, "subnet.create").filter(object_id=str(subnet.pk)).exists()


@pytest.mark.parametrize(
    "data, field",
    [
        ({"form": "subnet", "cidr": ""}, "cidr"),
        ({"form": "subnet", "cidr": "not-a-cidr"}, "cidr"),
        ({"form": "subnet", "cidr": "10.1.2.0/24", "gateway_ip": "300.1.1.1"}, "gateway_ip"),
        ({"form": "subnet", "cidr": "10.1.2.0/24", "dns_servers": "dns.example"}, "dns_servers"),
        ({"form": "port", "fixed_ip": "10.9.9.9"}, "fixed_ip"),
        ({"form": "port", "fixed_ip": "nope"}, "fixed_ip"),
        ({"form": "port", "security_groups": ["no-such-group"]}, "security_groups"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(login, project, users_by_role, net, data, field):
    response = login(users_by_role[Role.MEMBER]).post(
        url("network-detail", project, pk=net.pk), data
    )
    assert response.status_code in (400, 409)
    assert f'data-field="{field}"' in response.content.decode()


def test_an_unknown_form_is_a_400(login, project, users_by_role, net):
    response = login(users_by_role[Role.MEMBER]).post(
        url("network-detail", project, pk=net.pk), {"form": "nonsense"}
    )
    assert response.status_code == 400


def test_a_member_creates_and_deletes_a_port(login, project, users_by_role, net):
    client = login(users_by_role[Role.MEMBER])
    response = client.post(
        url("network-detail", project, pk=net.pk),
        {"form": "port", "name": "probe", "fixed_ip": "10.1.0.50", "port_security": "on"},
    )
    assert response.status_code == 302
    port = Port.objects.get(network=net, name="probe")
    assert [ip.address for ip in port.fixed_ips.all()] == ["10.1.0.50"]
    assert audited(project, "port.create").exists()
    response = client.post(url("port-delete", project, pk=port.pk))
    assert response.status_code == 302
    assert not Port.objects.filter(pk=port.pk).exists()


def test_a_port_takes_the_groups_ticked(login, project, users_by_role, net):
    web = network.security_group_create(project=project, name="web")
    response = login(users_by_role[Role.MEMBER]).post(
        url("network-detail", project, pk=net.pk),
        {"form": "port", "name": "front", "security_groups": ["web"], "port_security": "on"},
    )
    assert response.status_code == 302
    assert list(Port.objects.get(name="front").security_groups.all()) == [web]


def test_a_member_removes_a_subnet_unless_in_use(login, project, users_by_role, net):
    client = login(users_by_role[Role.MEMBER])
    spare = network.subnet_create(network=net, cidr="10.1.1.0/24")
    assert client.post(url("subnet-delete", project, pk=spare.pk)).status_code == 302
    assert not Subnet.objects.filter(pk=spare.pk).exists()
    assert audited(project, "subnet.delete").exists()
    used = Subnet.objects.get(network=net)
    network.port_create(network=net)
    response = client.post(url("subnet-delete", project, pk=used.pk), follow=True)
    assert "in use" in response.content.decode()
    assert Subnet.objects.filter(pk=used.pk).exists()
    refusal = AuditEvent.objects.for_project(project).get(outcome=AuditOutcome.FAILED)
    assert refusal.action == "portal.subnet_delete" and refusal.detail["status"] == 409


def test_a_member_sets_outbound_access(login, project, users_by_role, net):
    client = login(users_by_role[Role.MEMBER])
    make_pool()
    Quota.objects.filter(project=project).update(global_ips=5)
    response = client.post(
        url("network-detail", project, pk=net.pk), {"form": "outbound", "external_access": "on"}
    )
    assert response.status_code == 302
    net.refresh_from_db()
    assert net.external_access
    assert audited(project, "network.update").exists()
    client.post(url("network-detail", project, pk=net.pk), {"form": "outbound"})
    net.refresh_from_db()
    assert not net.external_access


@pytest.mark.parametrize("role", [Role.READER])
def test_readers_cannot_write(login, project, users_by_role, net, role):
    port = network.port_create(network=net)
    client = login(users_by_role[role])
    response = client.post(
        url("network-detail", project, pk=net.pk), {"form": "subnet", "cidr": "10.1.1.0/24"}
    )
    assert response.status_code == 403
    assert client.post(url("port-delete", project, pk=port.pk)).status_code == 403
    assert Port.objects.filter(pk=port.pk).exists()
    assert not Subnet.objects.filter(cidr="10.1.1.0/24").exists()


def test_outsiders_get_404(login, project, net):
    outsider = make_project().owner
    assert login(outsider).get(url("network-detail", project, pk=net.pk)).status_code == 404


# --- global IPs: 1:1 NAT ----------------------------------------------------------------------


@pytest.fixture
def address(project):
    make_pool()
    Quota.objects.filter(project=project).update(global_ips=5)
    return network.global_ip_allocate(project=project)


def test_a_member_associates_and_disassociates_a_global_ip(
    login, project, users_by_role, net, address
):
    port = network.port_create(network=net)
    client = login(users_by_role[Role.MEMBER])
    response = client.post(
        url("global-ips", project),
        {"form": "associate", "global_ip": address.pk, "port": port.pk},
    )
    assert response.status_code == 302
    address.refresh_from_db()
    assert address.port_id == port.pk
    assert audited(project, "global_ip.associate").filter(detail__port=str(port.pk)).exists()
    assert "Disassociate" in client.get(url("global-ips", project)).content.decode()

    response = client.post(url("global-ip-disassociate", project, pk=address.pk))
    assert response.status_code == 302
    address.refresh_from_db()
    assert address.port_id is None
    assert audited(project, "global_ip.associate").filter(detail__port=None).exists()


def test_associating_another_projects_port_is_a_400(
    login, project, other_project, users_by_role, address
):
    Quota.objects.filter(project=other_project).update(networks=5)
    theirs = network.port_create(network=make_network(other_project, "x", cidr="10.8.0.0/24"))
    response = login(users_by_role[Role.MEMBER]).post(
        url("global-ips", project),
        {"form": "associate", "global_ip": address.pk, "port": theirs.pk},
    )
    assert response.status_code == 400
    assert 'data-field="port"' in response.content.decode()
    assert GlobalIp.objects.get(pk=address.pk).port_id is None


def test_readers_cannot_associate(login, project, users_by_role, net, address):
    port = network.port_create(network=net)
    response = login(users_by_role[Role.READER]).post(
        url("global-ips", project),
        {"form": "associate", "global_ip": address.pk, "port": port.pk},
    )
    assert response.status_code == 403
    assert GlobalIp.objects.get(pk=address.pk).port_id is None
