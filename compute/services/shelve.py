"""Shelve and unshelve: releasing a VM's every claim in one action, and getting it back.

What "kept" means. A shelved VM's root disk (the qcow2 overlay on its image, which holds
everything the guest wrote) lives at ``kept_disk``: ``<KUMO_SHELVE_STORE>/<vm id>.qcow2``,
a directory every host reaches at the same path (the image store or a shared pool, as
the images are). The host task that shelves (a ``vm_apply`` with desired ``absent`` and
``extra.keep_root_disk``, ``compute.host_tasks``) stops the guest gracefully, moves its
instance overlay there unless the kept disk is already there, then undefines the guest.
Each step is a no-op when already done, so a repeated or re-delivered task is harmless.
On libvirt's test driver (simulated hosts) no disk exists: the path is recorded on the VM
and the next boot's domain names it as its root disk, which is what the tests read.

The life:

1. ``vm_shelve``: running or stopped → ``shelving`` (a conditional update on the
   generation, ``compute.services.lifecycle.transition``). The VM keeps its claim and bills it
   at the held price until its host reports the guest gone.
2. ``vm_finish_shelve`` (the host reports the guest absent at the shelve's generation,
   ``compute.services.reconcile``): in one transaction its GPUs, vCPUs, memory and host
   are released (``compute.placement.release``) and it is ``shelved``: it holds no host,
   no GPU and no quota, and bills its kept disk as storage.
3. ``vm_unshelve``: shelved → ``pending``, its quota claimed again (409 if the project
   used it meanwhile), placed like a new request anywhere it fits or waiting for capacity
   (an on-demand one may evict spot VMs); it boots from ``kept_disk``.

Deleting a shelved VM ends its bill at once. Its kept disk file is removed by a task to
one host that is up (the store is shared); if none is, the file stays (an operator
removes it: it is named by the VM's id).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from compute import placement
from compute.choices import DesiredPower, HostState, Priority, VmState, VmTask
from compute.models import Host, VirtualMachine
from compute.protocol import VM_APPLY_TASK, VmApply
from compute.services.lifecycle import (
    guard,
    kept_disk_path,
    open_operation,
    requeue,
    send_apply,
    transition,
)
from controlplane import agents, audit, events
from controlplane.models import Operation
from tenants import usage

log = logging.getLogger(__name__)


@transaction.atomic
def vm_shelve(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """running or stopped → shelving → shelved once its host has kept its disk and let go
    (``vm_finish_shelve``). 409 from any other state or with an action in flight."""
    guard(vm, "shelve")
    vm = transition(
        vm,
        state=VmState.SHELVING,
        task_state=VmTask.NONE,
        kept_disk=kept_disk_path(vm),
        reclaim_action="",
        reclaim_reason="",
        reclaim_at=None,
        reclaim_noticed_at=None,
        state_reason="stopping and keeping the root disk; then every claim is released",
    )
    operation = open_operation(vm, "vm.shelve", actor)
    audit.record(
        "vm.shelve",
        vm,
        project=vm.project,
        detail={"operation": str(operation.pk), "kept_disk": vm.kept_disk},
    )
    send_apply(vm, operation_id=str(operation.pk))
    log.info("vm %s generation %d: shelving to %s", vm.pk, vm.generation, vm.kept_disk)
    return vm, operation


def vm_finish_shelve(vm: VirtualMachine) -> None:
    """shelving → shelved: give back the host's vCPUs and memory and the VM's GPUs. Call in
    the transaction holding the VM's row lock, when its host reported the guest absent at
    the shelve's generation (the disk is kept by then: the host keeps it before it
    undefines the guest)."""
    from network import services as network

    host_name = vm.host.name if vm.host_id else ""
    placement.release(vm)
    network.ports_unbind(vm)
    now = timezone.now()
    changes = {
        "state": VmState.SHELVED,
        "task_state": VmTask.NONE,
        "host": None,
        "numa_cell": None,
        "rack": "",
        "shelved_at": now,
        "state_reason": f"shelved from {host_name} at {now.isoformat()}",
    }
    VirtualMachine.objects.filter(pk=vm.pk).update(**changes, updated_at=now)
    for name, value in changes.items():
        setattr(vm, name, value)
    vm.host_id = None
    usage.vm_usage_sync(vm, at=now)
    audit.record("vm.shelved", vm, project=vm.project, detail={"host": host_name})
    events.emit(
        "vm.shelved",
        project=vm.project,
        message=f"vm {vm.name} is shelved: it holds no GPU or host; unshelve it to run again",
        obj=vm,
        payload={"vm": str(vm.pk), "kept_disk": vm.kept_disk},
    )
    log.info("vm %s generation %d: shelved from %s", vm.pk, vm.generation, host_name)


@transaction.atomic
def vm_unshelve(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """shelved → pending → placed anywhere it fits, as a new request: when nothing fits it
    waits (an on-demand VM may evict spot VMs for it). Its quota is claimed again (a
    shelved VM holds none), so a project that used it meanwhile gets 409."""
    operation, placed = requeue(vm, action="unshelve", kind="vm.unshelve", actor=actor)
    if not placed and vm.priority == Priority.ON_DEMAND:
        from compute.services import spot

        spot.preempt_for(vm)
    audit.record(
        "vm.unshelve",
        vm,
        project=vm.project,
        detail={"operation": str(operation.pk), "state": vm.state, "kept_disk": vm.kept_disk},
    )
    send_apply(vm, operation_id=str(operation.pk))
    return vm, operation


def kept_disk_remove(vm: VirtualMachine) -> None:
    """After commit, ask one host that is up to remove a deleted shelved VM's kept disk
    (the store is shared); none up: the file stays, named by the VM's id."""
    if not vm.kept_disk:
        return
    host = Host.objects.filter(state=HostState.UP).order_by("name").first()
    if host is None:
        log.warning("vm %s: no host up to remove kept disk %s", vm.pk, vm.kept_disk)
        return
    message = VmApply(
        vm_id=str(vm.pk),
        generation=vm.generation,
        desired=DesiredPower.ABSENT,
        extra={"remove_root_disk": vm.kept_disk},
    )
    agents.send_to_host(host.name, VM_APPLY_TASK, **message.to_wire())
