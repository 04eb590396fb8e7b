"""Holding is never free and releasing is one action: a stopped VM bills its claim at the
held price; shelve releases every claim (another VM takes the same GPUs) and keeps the
root disk, which unshelve boots (read back through libvirt's test driver); a spot VM whose
template says so is shelved at its eviction; the API answers 409 on a wrong state."""

import json
from datetime import date
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from compute import host_tasks, services
from compute.choices import EvictAction, HostState, Priority, VmState
from compute.drivers import simnode
from compute.drivers.libvirt import LibvirtDriver
from compute.models import Device, Host, VirtualMachine
from compute.protocol import VmApply
from compute.services import spot
from compute.services.lifecycle import apply_message
from controlplane.agent import runtime
from controlplane.agent.config import AgentConfig
from controlplane.errors import Conflict
from controlplane.models import AuditEvent
from network.choices import PortStatus
from network.desired import host_networks
from network.models import HostNetwork, Port
from network.selectors import port_statuses
from tenants import billing
from tenants import services as tenants
from tenants.models import UsageRecord
from tests.compute.test_vms import fresh, report
from tests.compute.test_vms import project as project
from tests.factories import (
    enroll_network,
    make_host,
    make_network,
    make_project,
    make_template,
    make_vm,
)

pytestmark = pytest.mark.django_db

PRICES = [
    {"resource": "vcpu", "unit_price": "10"},
    {"resource": "memory", "unit_price": "1.5"},
    {"resource": "gpu", "unit_price": "300"},
    {"resource": "gpu", "model": "A100-SXM4-40GB", "unit_price": "500"},
    {"resource": "storage", "unit_price": "7.3"},
    {"resource": "global_ip", "unit_price": "2"},
]


def roomy_project():
    other = make_project()
    tenants.quota_set(project=other, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    return other


def running_vm(project, **fields):
    vm = make_vm(project, **fields)
    report(fresh(vm), "running")
    return fresh(vm)


def test_a_stopped_gpu_vms_held_gpus_are_on_the_next_invoice_at_the_held_price(project, sent):
    billing.rate_card_create(
        valid_from=timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0),
        prices=PRICES,
        held_factor=Decimal("0.4"),
    )
    make_host()
    vm = running_vm(project, template=make_template(gpus=2))
    vm, _ = services.vm_stop(vm=vm)
    report(fresh(vm), "shutoff")
    assert fresh(vm).state == VmState.STOPPED
    document, total = billing.invoice_compute(project, billing.month_start(date.today()))
    lines = json.loads(document)["lines"]
    held = [li for li in lines if li["priority"] == "held" and li["resource"] == "gpu"]
    assert len(held) == 1
    [line] = held
    assert line["model"] == "A100-SXM4-40GB"
    assert Decimal(line["unit_price"]) == Decimal(500) and Decimal(line["factor"]) == Decimal("0.4")
    assert Decimal(line["quantity"]) > 0
    expected = Decimal(line["quantity"]) * 500 * Decimal("0.4")
    assert abs(Decimal(line["amount"]) - expected) <= Decimal("0.01")
    assert any(li["resource"] == "storage" for li in lines)  # its disk, as storage
    assert total > 0


def test_shelve_frees_every_claim_and_a_second_vm_takes_the_same_gpus(project, sent):
    host = make_host()
    vm = running_vm(project, template=make_template(gpus=8))
    gpus = set(Device.objects.filter(vm=vm).values_list("pk", flat=True))
    assert len(gpus) == 8
    vm, _ = services.vm_shelve(vm=vm)
    assert vm.state == VmState.SHELVING and vm.kept_disk.endswith(f"{vm.pk}.qcow2")
    # The host is asked to keep the disk and let the guest go.
    message = apply_message(fresh(vm))
    assert message.desired == "absent" and message.extra["keep_root_disk"] == vm.kept_disk
    # Until the host let go the claim is held (and billed as held).
    assert Device.objects.filter(vm=vm).count() == 8
    open_ = UsageRecord.objects.filter(subject_id=str(vm.pk), ended_at=None)
    assert {r.priority for r in open_} == {"held", "on_demand"}  # on demand: the disk
    report(fresh(vm), "absent")
    vm = fresh(vm)
    assert vm.state == VmState.SHELVED and vm.host_id is None and vm.shelved_at is not None
    host.refresh_from_db()
    assert (host.vcpus_used, host.memory_mib_used) == (0, 0)
    assert not Device.objects.filter(vm=vm).exists()
    # Only its kept disk bills now.
    assert {
        (r.resource, r.quantity)
        for r in UsageRecord.objects.filter(subject_id=str(vm.pk), ended_at=None)
    } == {("storage", Decimal(vm.disk_gib))}
    other = make_vm(roomy_project(), template=make_template(gpus=8))
    assert other.state == VmState.PROVISIONING
    assert set(Device.objects.filter(vm=other).values_list("pk", flat=True)) == gpus
    assert AuditEvent.objects.filter(action="vm.shelved", object_id=str(vm.pk)).exists()
    # Unshelve waits for capacity like a new request: the host is full.
    vm, _ = services.vm_unshelve(vm=vm)
    assert vm.state == VmState.PENDING and "no host" in vm.state_reason
    services.vm_delete(vm=fresh(other))
    report(fresh(other), "absent")
    assert services.vm_schedule_pending() == 1
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING
    assert apply_message(vm).extra["root_disk"] == vm.kept_disk  # boots its kept disk


def test_a_shelved_vms_ports_leave_its_host_and_bind_where_it_is_placed_again(project, sent):
    a, b = make_host("gpu-a"), make_host("gpu-b")
    enroll_network(a, "10.0.0.1")
    enroll_network(b, "10.0.0.2")
    net = make_network(project, "lab")
    vm = running_vm(project, template=make_template(gpus=8), nics=[{"network": net}])
    first, other = (a, b) if vm.host_id == a.pk else (b, a)
    peer = running_vm(project, template=make_template(gpus=8), nics=[{"network": net}])
    assert peer.host_id == other.pk
    port = Port.objects.get(vm=vm)
    assert port.host_id == first.pk
    assert (port.mac, "10.0.0.1" if first == a else "10.0.0.2") in _remote_macs(other)
    before = HostNetwork.objects.get(host=first).desired_generation

    vm, _ = services.vm_shelve(vm=vm)
    report(fresh(vm), "absent")
    assert fresh(vm).state == VmState.SHELVED
    port.refresh_from_db()
    assert (port.host_id, port.bound_generation) == (None, 0)
    assert port_statuses([port])[port.pk] == PortStatus.DOWN
    # The host it left drops its firewall and the network no other port of it needs, and
    # is told so; the peer's host stops sending the shelved VM's MAC there.
    here = host_networks(first.pk)
    assert (here.ports, here.networks) == ((), ())
    assert HostNetwork.objects.get(host=first).desired_generation > before
    assert port.mac not in {mac for mac, _vtep in _remote_macs(other)}

    services.host_set_state(host=first, state=HostState.MAINTENANCE, reason="firmware")
    services.vm_delete(vm=fresh(peer))
    report(fresh(peer), "absent")
    vm, _ = services.vm_unshelve(vm=fresh(vm))
    assert (vm.state, vm.host_id) == (VmState.PROVISIONING, other.pk)
    port.refresh_from_db()
    assert port.host_id == other.pk and port.bound_generation > 0
    assert [p.mac for p in host_networks(other.pk).ports] == [port.mac]


def _remote_macs(host) -> set:
    return {mac for network in host_networks(host.pk).networks for mac in network.remote_macs}


def test_shelve_and_unshelve_answer_409_from_the_wrong_state(project, sent):
    make_host()
    vm = make_vm(project, template=make_template(gpus=1))  # provisioning
    client = APIClient()
    client.force_authenticate(project.owner)
    base = f"/api/v1/projects/{project.slug}/vms/{vm.pk}"
    answer = client.post(f"{base}/shelve/")
    assert answer.status_code == 409 and answer.json()["details"]["state"] == ["provisioning"]
    answer = client.post(f"{base}/unshelve/")
    assert answer.status_code == 409
    report(fresh(vm), "running")
    assert client.post(f"{base}/shelve/").status_code == 202
    assert client.post(f"{base}/shelve/").status_code == 409  # shelving already
    report(fresh(vm), "absent")
    assert client.post(f"{base}/unshelve/").status_code == 202
    assert fresh(vm).state == VmState.PROVISIONING
    actions = set(AuditEvent.objects.filter(object_id=str(vm.pk)).values_list("action", flat=True))
    assert {"vm.shelve", "vm.shelved", "vm.unshelve"} <= actions


def test_unshelve_claims_the_quota_again(project, sent):
    make_host()
    vm = running_vm(project, template=make_template(gpus=4))
    services.vm_shelve(vm=vm)
    report(fresh(vm), "absent")
    tenants.quota_set(project=project, gpus=4, vcpus=1024, memory_gib=8192, vms=64)
    make_vm(project, template=make_template(gpus=4))  # uses the quota the shelved VM gave back
    with pytest.raises(Conflict):
        services.vm_unshelve(vm=fresh(vm))
    assert fresh(vm).state == VmState.SHELVED


def test_a_spot_vm_whose_template_says_shelve_is_shelved_at_its_eviction(project, sent):
    host = make_host()
    template = make_template(gpus=8, evict_action=EvictAction.SHELVE, eviction_notice_s=0)
    victim = running_vm(project, template=template, priority=Priority.SPOT)
    waiter = make_vm(roomy_project(), template=make_template(gpus=8))
    assert fresh(victim).state == VmState.EVICTING and waiter.state == VmState.PENDING
    spot.evictions_reap()
    report(fresh(victim), "shutoff")
    victim, waiter = fresh(victim), fresh(waiter)
    assert victim.state == VmState.SHELVED and victim.kept_disk and victim.host_id is None
    assert waiter.state == VmState.PROVISIONING and waiter.host_id == host.pk
    # The old host was told to keep the disk and let the stopped guest go.
    keeps = [
        queue
        for queue, _name, kwargs in sent
        if kwargs.get("extra", {}).get("keep_root_disk") == victim.kept_disk
    ]
    assert keeps == [f"host.{host.name}"]


# --- the host side, on libvirt's test driver -------------------------------------------------


@pytest.fixture
def hv(tmp_path):
    runtime.configure(AgentConfig.from_env(host="gpu-01", instances_dir=tmp_path / "instances"))
    fleet = simnode.write_fleet(tmp_path / "fleet", 1, 0)
    driver = LibvirtDriver(f"test://{fleet['gpu-01']}", poll_interval_s=0.001)
    yield driver
    driver.close()
    runtime.configure(None)


def _boot(vm_id, generation, **extra):
    return VmApply(
        vm_id=vm_id,
        generation=generation,
        desired="running",
        name="lab/train",
        hostname="train",
        vcpus=4,
        memory_mib=4096,
        graceful_timeout_s=0.2,
        extra=extra,
    )


def test_the_host_keeps_the_disk_idempotently_and_unshelve_boots_it(hv, tmp_path):
    vm_id = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
    kept = str(tmp_path / "shelved" / f"{vm_id}.qcow2")
    assert host_tasks.apply(_boot(vm_id, 1), hv) == (1, "running")
    shelve = VmApply(
        vm_id=vm_id,
        generation=2,
        desired="absent",
        graceful_timeout_s=0.2,
        extra={"keep_root_disk": kept},
    )
    assert host_tasks.apply(shelve, hv) == (2, "absent")
    assert host_tasks.apply(shelve, hv) == (2, "absent")  # repeated: harmless
    assert [g.vm_id for g in hv.list_guests()] == []
    # Unshelved (on this or any host): the domain's root disk is the kept one.
    assert host_tasks.apply(_boot(vm_id, 3, root_disk=kept), hv) == (3, "running")
    xml = hv.domain_xml(vm_id)
    assert f"<source file='{kept}'" in xml or f'<source file="{kept}"' in xml


def test_hosts_used_counters_match_after_shelve(project, sent):
    make_host()
    vm = running_vm(project, template=make_template(gpus=2))
    services.vm_shelve(vm=vm)
    report(fresh(vm), "absent")
    from compute.selectors import host_usage_drift

    assert not host_usage_drift()
    assert Host.objects.get().vcpus_used == 0
    assert VirtualMachine.objects.get(pk=vm.pk).state == VmState.SHELVED
