"""A pending VM whose RDMA port finds no free virtual function on the host the scheduler
chose waits with that reason, its claim undone; the pass goes on and places the VMs behind
it, and the hand-over of an eviction fails alike for that VM alone.

(The scheduler does not yet count a host's free VFs: docs/user/networks.md, Limits.)"""

import pytest

from compute import services
from compute.choices import HostState, VmState
from compute.models import Device, VirtualMachine
from compute.protocol import VM_APPLY_TASK
from controlplane.errors import Conflict
from network import services as network
from network.models import Port
from tests.compute.test_spot import roomy as roomy
from tests.compute.test_spot import world as world
from tests.compute.test_vms import fresh, report
from tests.compute.test_vms import sent as sent
from tests.factories import enroll_network, make_host, make_network, make_template, make_vm

pytestmark = pytest.mark.django_db

NO_VF = "no free RDMA virtual function on the VM's host"


def test_a_pass_places_the_vms_behind_one_whose_rdma_port_cannot_bind(project, sent):
    host = make_host("gpu-vf")
    enroll_network(host, "10.0.0.9", sriov_pfs={"ens1f0": 16})
    roce = make_network(project, "roce", kind="rdma", cidr="10.5.0.0/24")
    services.host_set_state(host=host, state=HostState.MAINTENANCE, reason="firmware")
    gpu = make_template(gpus=1)
    rdma_vm = make_vm(project, template=gpu, nics=[{"network": roce}])  # first in the queue
    plain_vm = make_vm(project, template=gpu)
    assert {fresh(rdma_vm).state, fresh(plain_vm).state} == {VmState.PENDING}
    services.host_set_state(host=fresh_host(host), state=HostState.UP)
    # Every VF of the host is held by a port without a VM meanwhile.
    held = []
    while Device.objects.filter(host=host, kind="rdma_vf", vm__isnull=True, port__isnull=True):
        held.append(network.port_create(network=roce, host=host))

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

    before = VirtualMachine.objects.count()
    with pytest.raises(Conflict) as refused:  # a new one is refused, not left half made
        make_vm(project, template=gpu, nics=[{"network": roce}])
    assert (refused.value.code, refused.value.message) == ("no_capacity", NO_VF)
    assert VirtualMachine.objects.count() == before

    network.port_delete(port=held[0])  # a VF is free again: the next pass places it
    assert services.vm_schedule_pending() == 1
    waiting = fresh(waiting)
    assert (waiting.state, waiting.host_id) == (VmState.PROVISIONING, host.pk)
    assert Port.objects.get(vm=waiting).vf_id == held[0].vf_id


def fresh_host(host):
    return type(host).objects.get(pk=host.pk)


def test_a_hand_over_whose_rdma_port_cannot_bind_leaves_the_waiter_waiting(world, sent):
    """The room freed by evictions on the host held for an on-demand VM: the VM's RDMA port
    finds no free VF there, so the VM is not placed there; it waits again for room, and the
    report that completed the hand-over is still taken."""
    b = world["b"]
    enroll_network(b, "10.0.0.9", sriov_pfs={"ens1f0": 16})
    roce = make_network(world["wants"], "roce", kind="rdma", cidr="10.5.0.0/24")
    while Device.objects.filter(host=b, kind="rdma_vf", vm__isnull=True, port__isnull=True):
        network.port_create(network=roce, host=b)
    vm = make_vm(world["wants"], template=world["t8"], image=world["image"],
                 nics=[{"network": roce}])  # fmt: skip
    assert fresh(vm).reserved_host_id == b.pk
    for victim in VirtualMachine.objects.filter(state=VmState.EVICTING):
        services.vm_delete(vm=fresh(victim))
        report(fresh(victim), "absent")  # the last one hands the host over
    vm = fresh(vm)
    assert (vm.state, vm.host_id, vm.reserved_host_id) == (VmState.PENDING, None, None)
    assert NO_VF in vm.state_reason and "waiting for room" in vm.state_reason
    assert not Device.objects.filter(vm=vm).exists()
    assert Port.objects.get(vm=vm).vf_id is None
