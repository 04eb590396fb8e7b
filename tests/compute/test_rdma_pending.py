"""A VM's ports on RDMA networks each need a free virtual function of its host's RDMA NIC.
The scheduler counts each host's free VFs (given to no VM, held by no port): a VM goes to a
host with enough, waits while none has them, and the spot VMs evicted for it free the VFs
it needs too, or none is. A claim made on a view that missed a VF taken meanwhile (another
process's port) is undone: the VM waits with that reason and the pass goes on with the VMs
behind it; the hand-over of an eviction fails alike for that VM alone. A VM that leaves its host
(evicted, shelved) gives its VFs back, and takes new ones where it is placed again."""

from datetime import timedelta

import pytest
from django.utils import timezone

from compute import placement, services
from compute.choices import HostState, Priority, VmState
from compute.models import Device, Host, VirtualMachine
from compute.protocol import VM_APPLY_TASK
from controlplane.errors import Conflict
from network import services as network
from network.models import Port
from tenants import services as tenants
from tests.compute.test_guarantees import MODEL
from tests.compute.test_spot import roomy as roomy
from tests.compute.test_spot import world as world
from tests.compute.test_vms import fresh, report
from tests.compute.test_vms import sent as sent
from tests.factories import (
    enroll_network,
    make_host,
    make_network,
    make_project,
    make_template,
    make_vm,
)

pytestmark = pytest.mark.django_db

NO_VF = "no free RDMA virtual function on the VM's host"
NO_VF_ROOM = "without enough free RDMA virtual functions"


def _rdma_host(name, vtep):
    host = make_host(name)
    enroll_network(host, vtep, sriov_pfs={"ens1f0": 16})
    return host


def _free_vfs(host):
    return Device.objects.filter(host=host, kind="rdma_vf", vm__isnull=True, port__isnull=True)


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """``committed(service, **kwargs)``: the service, then what its commit would do in this
    process (the test's transaction never commits): here, the view reading again the host
    whose VFs a port took or gave back."""

    def run(service, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return service(**kwargs)

    return run


def _take_every_vf(roce, host, committed) -> list[Port]:
    """Every free VF of ``host`` held by a port without a VM (a container's, say)."""
    held = []
    while _free_vfs(host).exists():
        held.append(committed(network.port_create, network=roce, host=host))
    return held


def test_an_rdma_vm_goes_to_a_host_with_a_free_vf_over_a_tighter_fit_without_one(
    project, sent, committed
):
    a, b = _rdma_host("gpu-a", "10.0.0.1"), _rdma_host("gpu-b", "10.0.0.2")
    roce = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    gpu = make_template(gpus=1)
    first = make_vm(project, template=gpu)  # A or B: the other stays whole
    tight = Host.objects.get(pk=fresh(first).host_id)
    roomy_host = b if tight.pk == a.pk else a
    _take_every_vf(roce, tight, committed)

    plain = make_vm(project, template=gpu)  # packs beside the first
    rdma = make_vm(project, template=gpu, nics=[{"network": roce}])

    assert fresh(plain).host_id == tight.pk
    rdma = fresh(rdma)
    assert (rdma.state, rdma.host_id, rdma.rdma_vfs) == (VmState.PROVISIONING, roomy_host.pk, 1)
    port = Port.objects.select_related("vf").get(vm=rdma)
    assert (port.host_id, port.vf.host_id, port.vf.vm_id) == (roomy_host.pk, roomy_host.pk, rdma.pk)


def test_an_rdma_vm_waits_while_no_host_has_a_free_vf_and_the_pass_goes_on(
    project, sent, committed
):
    host = _rdma_host("gpu-vf", "10.0.0.9")
    roce = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    held = _take_every_vf(roce, host, committed)
    gpu = make_template(gpus=1)

    rdma_vm = make_vm(project, template=gpu, nics=[{"network": roce}, {"network": roce}])
    plain_vm = make_vm(project, template=gpu)

    waiting = fresh(rdma_vm)
    assert (waiting.state, waiting.host_id, waiting.rdma_vfs) == (VmState.PENDING, None, 2)
    assert "2 RDMA virtual function(s)" in waiting.state_reason
    assert f"1 {NO_VF_ROOM}" in waiting.state_reason
    assert fresh(plain_vm).host_id == host.pk
    before = VirtualMachine.objects.count()
    with pytest.raises(Conflict) as refused:  # asked not to wait: refused, nothing made
        make_vm(project, template=gpu, nics=[{"network": roce}], wait_for_capacity=False)
    assert refused.value.code == "no_capacity" and NO_VF_ROOM in refused.value.message
    assert VirtualMachine.objects.count() == before

    committed(network.port_delete, port=held[0])  # one VF free: not yet two
    assert services.vm_schedule_pending() == 0
    assert fresh(rdma_vm).state == VmState.PENDING
    committed(network.port_delete, port=held[1])
    assert services.vm_schedule_pending() == 1
    placed = fresh(rdma_vm)
    assert (placed.state, placed.host_id) == (VmState.PROVISIONING, host.pk)
    vfs = set(Port.objects.filter(vm=placed).values_list("vf_id", flat=True))
    assert vfs == {held[0].vf_id, held[1].vf_id}


def test_a_claim_on_a_view_that_missed_a_vf_taken_elsewhere_is_undone(
    project, sent, committed, monkeypatch
):
    """Another process's port took the host's VFs after this process read the host: the
    pass's claim for the RDMA VM finds no VF and is rolled back, the VM waits with that
    reason, and the pass places the VM behind it."""
    host = _rdma_host("gpu-vf", "10.0.0.9")
    roce = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    services.host_set_state(host=host, state=HostState.MAINTENANCE, reason="firmware")
    gpu = make_template(gpus=1)
    rdma_vm = make_vm(project, template=gpu, nics=[{"network": roce}])  # first in the queue
    plain_vm = make_vm(project, template=gpu)
    assert {fresh(rdma_vm).state, fresh(plain_vm).state} == {VmState.PENDING}
    services.host_set_state(host=Host.objects.get(pk=host.pk), state=HostState.UP)
    placement.view.invalidate()
    with placement.view.lock:
        assert placement.view.get().hosts[host.pk].vfs_free > 0  # read with its VFs free
    # As in another process: this one's view is not told of the VFs taken.
    monkeypatch.setattr(placement, "vfs_changed", lambda host_id: None)
    held = _take_every_vf(roce, host, committed)

    assert services.vm_schedule_pending() == 1  # the pass went on past the RDMA VM

    waiting = fresh(rdma_vm)
    assert (waiting.state, waiting.host_id) == (VmState.PENDING, None)
    assert NO_VF in waiting.state_reason
    assert not Device.objects.filter(vm=waiting).exists()  # its GPU claim was rolled back
    assert Port.objects.get(vm=waiting).vf_id is None
    placed = fresh(plain_vm)
    assert (placed.state, placed.host_id) == (VmState.PROVISIONING, host.pk)
    applied = [(queue, kwargs["vm_id"]) for queue, task, kwargs in sent if task == VM_APPLY_TASK]
    assert applied == [(f"host.{host.name}", str(plain_vm.pk))]
    with placement.view.lock:  # the host was read again: its VFs are known taken
        assert placement.view.get().hosts[host.pk].vfs_free == 0

    monkeypatch.undo()
    committed(network.port_delete, port=held[0])  # a VF is free: the next pass places it
    assert services.vm_schedule_pending() == 1
    waiting = fresh(waiting)
    assert (waiting.state, waiting.host_id) == (VmState.PROVISIONING, host.pk)
    assert Port.objects.get(vm=waiting).vf_id == held[0].vf_id


def test_no_spot_vm_is_evicted_for_an_rdma_vm_on_a_host_without_a_free_vf(world, sent, committed):
    b = world["b"]
    enroll_network(b, "10.0.0.9", sriov_pfs={"ens1f0": 16})
    roce = make_network(world["wants"], "roce", kind="rdma", cidr="10.5.0.0/24")
    held = _take_every_vf(roce, b, committed)
    _take_every_vf(roce, world["a"], committed)

    vm = make_vm(world["wants"], template=world["t8"], image=world["image"],
                 nics=[{"network": roce}])  # fmt: skip

    vm = fresh(vm)
    assert (vm.state, vm.reserved_host_id) == (VmState.PENDING, None)
    assert "1 RDMA virtual function(s)" in vm.state_reason
    assert not VirtualMachine.objects.filter(state=VmState.EVICTING).exists()
    committed(network.port_delete, port=held[0])  # a VF on B: evicting there makes room
    services.vm_schedule_pending()
    assert fresh(vm).reserved_host_id == b.pk
    evicting = VirtualMachine.objects.filter(state=VmState.EVICTING)
    assert {v.pk for v in evicting} == {v.pk for v in world["big"]}


def test_a_hand_over_whose_rdma_port_cannot_bind_leaves_the_waiter_waiting(
    world, sent, committed, monkeypatch
):
    """The VFs of the host held for an on-demand VM were taken during the notice (by
    another process's ports): the hand-over reads the host again and finds no free VF
    there, so the VM is not placed there; it waits again for room, and the report that
    completed the hand-over is still taken."""
    b = world["b"]
    enroll_network(b, "10.0.0.9", sriov_pfs={"ens1f0": 16})
    roce = make_network(world["wants"], "roce", kind="rdma", cidr="10.5.0.0/24")
    vm = make_vm(world["wants"], template=world["t8"], image=world["image"],
                 nics=[{"network": roce}])  # fmt: skip
    assert fresh(vm).reserved_host_id == b.pk
    monkeypatch.setattr(placement, "vfs_changed", lambda host_id: None)
    _take_every_vf(roce, b, committed)
    for victim in VirtualMachine.objects.filter(state=VmState.EVICTING):
        services.vm_delete(vm=fresh(victim))
        report(fresh(victim), "absent")  # the last one hands the host over
    vm = fresh(vm)
    assert (vm.state, vm.host_id, vm.reserved_host_id) == (VmState.PENDING, None, None)
    assert NO_VF_ROOM in vm.state_reason and "waiting for room" in vm.state_reason
    assert not Device.objects.filter(vm=vm).exists()
    assert Port.objects.get(vm=vm).vf_id is None


def test_a_vm_that_leaves_its_host_gives_its_vfs_back_and_takes_new_ones_where_placed_again(
    project, sent
):
    a, b = _rdma_host("gpu-a", "10.0.0.1"), _rdma_host("gpu-b", "10.0.0.2")
    roce = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    spot = make_template(gpus=1, eviction_notice_s=30, evict_action="shelve")
    vm = make_vm(project, template=spot, priority=Priority.SPOT, nics=[{"network": roce}])
    report(fresh(vm), "running")
    first = fresh(vm).host
    other = b if first.pk == a.pk else a
    vf = Port.objects.get(vm=vm).vf
    assert vf.host_id == first.pk

    services.vm_shelve(vm=fresh(vm))
    report(fresh(vm), "absent")
    vm = fresh(vm)
    assert vm.state == VmState.SHELVED
    port = Port.objects.get(vm=vm)
    assert (port.host_id, port.vf_id) == (None, None)  # the VF is free for anyone
    assert _free_vfs(first).filter(pk=vf.pk).exists()

    services.host_set_state(host=first, state=HostState.MAINTENANCE, reason="firmware")
    services.vm_unshelve(vm=vm)
    vm = fresh(vm)
    assert (vm.state, vm.host_id) == (VmState.PROVISIONING, other.pk)
    port = Port.objects.select_related("vf").get(vm=vm)
    assert (port.host_id, port.vf.host_id, port.vf.vm_id) == (other.pk, other.pk, vm.pk)


def test_an_evicted_spot_vm_gives_its_vfs_back_to_the_vm_it_made_room_for(project, sent, roomy):
    project = roomy(project)
    host = _rdma_host("gpu-vf", "10.0.0.9")
    roce = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    spot = make_template(gpus=4, eviction_notice_s=30)
    victims = [
        make_vm(project, template=spot, priority=Priority.SPOT, nics=[{"network": roce}])
        for _ in range(2)
    ]
    for victim in victims:
        report(fresh(victim), "running")
    vfs = _free_vfs(host).count()
    victim_vfs = set(Port.objects.filter(vm__in=victims).values_list("vf_id", flat=True))
    assert len(victim_vfs) == 2 and None not in victim_vfs

    # An on-demand VM of the whole host, with as many RDMA ports as the host has VFs left
    # once its spot VMs give theirs back.
    nics = [{"network": roce}] * (vfs + 2)
    waiter = make_vm(project, template=make_template(name="g8", gpus=8), nics=nics)
    assert fresh(waiter).reserved_host_id == host.pk
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    for victim in victims:
        report(fresh(victim), "shutoff")

    for victim in victims:
        evicted = fresh(victim)
        assert evicted.state == VmState.EVICTED
        assert Port.objects.filter(vm=evicted).values_list("host_id", "vf_id").get() == (None, None)
    waiter = fresh(waiter)
    assert (waiter.state, waiter.host_id) == (VmState.PROVISIONING, host.pk)
    taken = set(Port.objects.filter(vm=waiter).values_list("vf_id", flat=True))
    assert victim_vfs <= taken and len(taken) == vfs + 2


def test_a_host_read_again_alone_is_the_view_a_load_of_the_fleet_makes_of_it(sent, committed):
    """``refresh_host``'s own read (the host and its GPUs in one, compiled once) against
    the ORM's read of the whole view, host by host: free VFs (a port holds some), GPUs a VM
    holds (on demand and spot), GPUs a lease holds, a host handed over to a waiting VM, a
    host out of service."""
    from compute.services import leases

    project = make_project()
    tenants.quota_set(project=project, vcpus=4096, memory_gib=16384, gpus=256, vms=256)
    rdma, plain, handed, away = (
        _rdma_host("gpu-a", "10.0.0.1"),
        make_host("gpu-b"),
        make_host("gpu-c"),
        make_host("gpu-d"),
    )
    roce = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    committed(network.port_create, network=roce, host=rdma)
    make_vm(project, template=make_template(gpus=2), nics=[{"network": roce}])
    make_vm(project, template=make_template(gpus=1), priority=Priority.SPOT)
    now = timezone.now()
    services.lease_create(
        project=project, name="held", gpus=2, gpu_model=MODEL,
        starts_at=now + timedelta(minutes=5), ends_at=now + timedelta(hours=1),
    )  # fmt: skip
    leases.leases_tick(now=now + timedelta(minutes=5))
    waiting = make_vm(project, template=make_template(gpus=8), name="waits")
    VirtualMachine.objects.filter(pk=waiting.pk).update(
        state=VmState.PENDING, host=None, reserved_host=handed
    )  # as a hand-over of evictions leaves it
    services.host_set_state(host=away, state=HostState.MAINTENANCE)

    whole = {v.id: v for v in placement._host_views(placement._open_hosts())}
    assert set(whole) == {rdma.pk, plain.pk}  # the one handed over and the one away are not
    assert 0 < whole[rdma.pk].vfs_free < 16  # ports hold some of its 16
    assert Device.objects.filter(lease__isnull=False).exists()
    reads = [placement._ONE_HOST.read()]  # or it raises
    assert all(type(value) in (str, int, bool) for read in reads for value in read.params)
    for host in Host.objects.all():
        alone = placement._open_host_view(host.pk)
        assert alone == ([whole[host.pk]] if host.pk in whole else []), host.name
