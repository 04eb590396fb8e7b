"""The VM page: how to reach the VM (login user, addresses, the global IP or port forward
that reaches it, the ssh command with the caller's key name), GPUs by host PCI address,
shelve and unshelve, and the state poll that keeps the badge, the reason, the note and the
buttons current."""

import re

import pytest
from django.urls import reverse

from compute.choices import VmState
from compute.models import VirtualMachine
from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from network import services as network
from network.models import Port
from tenants import services as tenants
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_image, make_network, make_pool, make_vm

pytestmark = pytest.mark.django_db

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0bXW1ZsJpEZx8o8DE2oqQxJgG6a4rGBpOIxYIJ2dJi ai@lab"


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


@pytest.fixture
def vm(project, cloud):
    Quota.objects.filter(project=project).update(networks=10, global_ips=10)
    net = make_network(project, name="lab", cidr="10.5.0.0/24")
    image = make_image(login_user="ubuntu")
    return make_vm(
        project,
        template=cloud["cpu"],
        image=image,
        name="train-1",
        ssh_keys=[KEY],
        nics=[{"network": net}],
    )


def _address(vm):
    return Port.objects.get(vm=vm).fixed_ips.get().address


def test_connect_names_the_user_the_address_and_the_key(login, project, cloud, vm):
    tenants.sshkey_add(user=project.owner, public_key=KEY.replace(" ai@lab", ""), name="lab-key")
    html = login(project.owner).get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert "<code>ubuntu</code>" in html
    assert f"<code>{_address(vm)}</code>" in html
    assert f"ssh -i ~/.ssh/lab-key ubuntu@{_address(vm)}" in html
    assert 'id="no-global-ip"' in html and url("global-ips", project) in html
    # Another member has no such key: ssh's default file for its type.
    other = login(cloud["users"][Role.MEMBER]).get(url("vm-detail", project, pk=vm.pk))
    assert f"ssh -i ~/.ssh/id_ed25519 ubuntu@{_address(vm)}" in other.content.decode()


def test_connect_goes_through_the_global_ip_or_the_ssh_forward(login, project, cloud, vm):
    make_pool()
    port = Port.objects.get(vm=vm)
    forward_ip = network.global_ip_allocate(project=project)
    network.port_forward_create(
        address=forward_ip, protocol="tcp", external_port=2201, port=port, internal_port=22
    )
    client = login(project.owner)
    html = client.get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert f"ssh -i ~/.ssh/id_ed25519 -p 2201 ubuntu@{forward_ip.address}" in html
    assert f"{forward_ip.address}:2201/tcp" in html and 'id="no-global-ip"' not in html
    nat = network.global_ip_allocate(project=project)
    network.global_ip_associate(address=nat, port=port)
    html = client.get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert f"ssh -i ~/.ssh/id_ed25519 ubuntu@{nat.address}" in html


def test_gpus_show_their_host_and_guest_pci_addresses(login, project, cloud):
    from compute.drivers.base import GuestSpec
    from compute.drivers.domain_xml import guest_pci_layout
    from compute.host_tasks import _devices
    from compute.services.lifecycle import apply_message

    vm = make_vm(project, template=cloud["gpu"], image=cloud["image"])
    html = login(project.owner).get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert "Host PCI address" in html and "Guest PCI address" in html
    assert f"<code>{vm.devices.get().pci_address}</code>" in html
    # Where the host's own path (the task it is sent, the domain it builds) puts the GPU.
    message = apply_message(VirtualMachine.objects.get(pk=vm.pk))
    spec = GuestSpec(vm_id=message.vm_id, generation=message.generation, name=message.name,
                     vcpus=message.vcpus, memory_mib=message.memory_mib,
                     numa_cell=message.numa_cell, devices=_devices(message))  # fmt: skip
    [slot] = guest_pci_layout(spec)
    assert slot.guest_address != slot.host_address
    assert f"<code>{slot.guest_address}</code>" in html


def _buttons(html) -> set[str]:
    return set(re.findall(r'data-action="([a-z_]+)"', html))


@pytest.mark.parametrize(
    ("state", "reason", "buttons"),
    [
        (VmState.RUNNING, "", {"stop", "reboot", "reset", "power_off", "shelve", "delete"}),
        (VmState.STOPPED, "stopped by its owner", {"start", "shelve", "delete"}),
        (VmState.SHELVED, "shelved from gpu-001", {"unshelve", "delete"}),
        (VmState.PENDING, "no host has room", {"delete"}),
    ],
)
def test_the_state_poll_carries_badge_reason_note_and_buttons(
    login, project, cloud, vm, state, reason, buttons
):
    VirtualMachine.objects.filter(pk=vm.pk).update(state=state, task_state="", state_reason=reason)
    response = login(project.owner).get(url("vm-state", project, pk=vm.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-state="{state}"' in html
    assert reason in html
    assert 'id="vm-actions" hx-swap-oob="true"' in html
    assert _buttons(html) == buttons
    assert f"VM train-1 is {state}." in html and 'hx-swap-oob="outerHTML:#vm-flash' in html


def test_a_reader_polls_the_state_but_gets_no_buttons(login, project, cloud, vm):
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING, task_state="")
    html = login(cloud["users"][Role.READER]).get(url("vm-state", project, pk=vm.pk))
    assert _buttons(html.content.decode()) == set()


def test_shelve_and_unshelve_go_through_the_service_and_are_audited(login, project, cloud, vm):
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING, task_state="")
    client = login(cloud["users"][Role.MEMBER])
    page = client.post(url("vm-action", project, pk=vm.pk, action="shelve"), follow=True)
    html = page.content.decode()
    assert f"Shelve of VM {vm.name} requested" in html
    assert '<ul class="messages" id="vm-flash"><li class="success">' in html
    vm.refresh_from_db()
    assert vm.state == VmState.SHELVING
    event = AuditEvent.objects.for_project(project).get(action="vm.shelve")
    assert event.actor == cloud["users"][Role.MEMBER] and event.source == "portal"
    assert _buttons(html) == {"delete"}
    refused = client.post(url("vm-action", project, pk=vm.pk, action="unshelve"), follow=True)
    assert "cannot unshelve it" in refused.content.decode()
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.SHELVED)
    client.post(url("vm-action", project, pk=vm.pk, action="unshelve"))
    assert AuditEvent.objects.for_project(project).filter(action="vm.unshelve").exists()
    vm.refresh_from_db()
    assert vm.state != VmState.SHELVED


def test_a_reader_may_not_shelve(login, project, cloud, vm):
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING, task_state="")
    reader = cloud["users"][Role.READER]
    response = login(reader).post(url("vm-action", project, pk=vm.pk, action="shelve"))
    assert response.status_code == 403
    assert VirtualMachine.objects.get(pk=vm.pk).state == VmState.RUNNING
    denied = AuditEvent.objects.for_project(project).get(outcome=AuditOutcome.DENIED)
    assert denied.actor == reader
