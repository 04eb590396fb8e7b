"""A port's security groups in the portal: its page shows them, a member changes them (and
port security) through ``network.services.port_update``, audited from the portal; no group
ticked is no group; a reader cannot, another project's port is not found, and a group that
is not the project's is a 400 naming the field."""

import re

import pytest
from django.urls import reverse

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from network import services as network
from network.models import Network, Port
from tenants.choices import Role
from tests.factories import make_network, make_project, make_vm

pytestmark = pytest.mark.django_db


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def groups_of(port):
    return sorted(Port.objects.get(pk=port.pk).security_groups.values_list("name", flat=True))


@pytest.fixture
def port(project):
    net = make_network(project, "lab", cidr="10.1.0.0/24")
    network.security_group_create(project=project, name="web")
    network.security_group_create(project=project, name="ssh")
    return network.port_create(network=net, name="probe")


def test_the_page_shows_the_ports_groups_and_the_form_ticks_them(
    login, project, users_by_role, port
):
    page = login(users_by_role[Role.MEMBER]).get(url("port-security-groups", project, pk=port.pk))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Port probe" in html
    assert 'id="port-groups"' in html and ">default</a>" in html
    assert re.search(r'value="default"[^>]*checked', html)
    assert 'value="web"' in html and not re.search(r'value="web"[^>]*checked', html)
    assert 'name="port_security"' in html and 'id="port-security"' in html


def test_a_member_changes_the_groups_and_port_security_audited(login, project, users_by_role, port):
    member = users_by_role[Role.MEMBER]
    answer = login(member).post(
        url("port-security-groups", project, pk=port.pk),
        {"security_groups": ["web", "ssh"], "port_security": "on"},
    )
    assert answer.status_code == 302
    assert answer["Location"] == url("network-detail", project, pk=port.network_id)
    assert groups_of(port) == ["ssh", "web"]
    assert Port.objects.get(pk=port.pk).port_security is True
    event = AuditEvent.objects.for_project(project).get(action="port.update")
    assert (event.actor, event.source, event.outcome) == (member, "portal", AuditOutcome.SUCCESS)
    assert event.detail["security_groups"] == ["ssh", "web"]
    # Unticked: port security off, its groups kept as they are.
    login(member).post(
        url("port-security-groups", project, pk=port.pk), {"security_groups": ["web", "ssh"]}
    )
    assert Port.objects.get(pk=port.pk).port_security is False
    network_page = login(member).get(url("network-detail", project, pk=port.network_id))
    assert "(not filtered)" in network_page.content.decode()


def test_no_group_ticked_is_no_group(login, project, users_by_role, port):
    answer = login(users_by_role[Role.MEMBER]).post(
        url("port-security-groups", project, pk=port.pk), {"port_security": "on"}
    )
    assert answer.status_code == 302
    assert groups_of(port) == []


def test_a_vms_nic_goes_back_to_the_vm(login, project, users_by_role, port):
    lab = Network.objects.for_project(project).get(name="lab")
    vm = make_vm(project, nics=[{"network": lab}])
    nic = Port.objects.get(vm=vm)
    client = login(users_by_role[Role.MEMBER])
    detail = client.get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert url("port-security-groups", project, pk=nic.pk) in detail
    answer = client.post(
        url("port-security-groups", project, pk=nic.pk),
        {"security_groups": ["ssh"], "port_security": "on"},
    )
    assert answer["Location"] == url("vm-detail", project, pk=vm.pk)
    assert groups_of(nic) == ["ssh"]
    assert (
        f"Security groups of port {vm.name} NIC 0 saved."
        in client.get(answer["Location"]).content.decode()
    )


def test_a_reader_may_look_but_not_change(login, project, users_by_role, port):
    reader = login(users_by_role[Role.READER])
    page = reader.get(url("port-security-groups", project, pk=port.pk))
    assert page.status_code == 200 and 'id="port-security"' not in page.content.decode()
    answer = reader.post(url("port-security-groups", project, pk=port.pk), {"port_security": "on"})
    assert answer.status_code == 403
    assert groups_of(port) == ["default"]


def test_another_projects_port_is_not_found(login, project, users_by_role):
    other = make_project()
    theirs = network.port_create(network=make_network(other, "theirs"), name="theirs")
    client = login(users_by_role[Role.OWNER])
    assert client.get(url("port-security-groups", project, pk=theirs.pk)).status_code == 404
    answer = client.post(url("port-security-groups", project, pk=theirs.pk), {})
    assert answer.status_code == 404
    assert groups_of(theirs) == ["default"]


def test_a_group_not_the_projects_is_a_400_naming_the_field(login, project, users_by_role, port):
    other = make_project()
    network.security_group_create(project=other, name="elsewhere")
    answer = login(users_by_role[Role.MEMBER]).post(
        url("port-security-groups", project, pk=port.pk),
        {"security_groups": ["elsewhere"], "port_security": "on"},
    )
    assert answer.status_code == 400
    html = answer.content.decode()
    assert 'data-field="security_groups"' in html and "elsewhere" in html
    assert groups_of(port) == ["default"]
