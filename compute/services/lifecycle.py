"""The VM state machine's core, shared by every path that changes a VM: the actions each
state allows, the guard and the conditional transition (of two racing requests exactly one
wins; the other gets 409), the VM's operations, placing, and the host work (``vm_apply``)
that follows every change. ``compute.services.vms`` (the user's actions), ``spot``,
``shelve``, ``reconcile`` and the other apps (``storage``: a volume attached or detached)
build on it; it imports none of them at import time.
"""

import time
from pathlib import PurePosixPath
from uuid import UUID

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from compute import placement
from compute.choices import DesiredPower, VmState, VmTask
from compute.models import Device, VirtualMachine
from compute.protocol import VM_APPLY_TASK, DeviceWire, InterfaceWire, VmApply
from compute.scheduler import NoValidHost
from compute.services.images import image_fetch
from controlplane import agents
from controlplane.choices import OperationState
from controlplane.compiled import Compiled, prefetched, refresh_from, update_where
from controlplane.errors import Conflict
from controlplane.models import Operation
from controlplane.services import DEADLINE_EXCEEDED, operation_create, operation_finish
from tenants import quotas, usage
from tenants.choices import ProjectStatus
from tenants.models import Project

# Which actions each state allows. Delete is allowed from every state but the last ones.
ACTIONS: dict[str, set[str]] = {
    VmState.PENDING: {"delete"},
    VmState.PROVISIONING: {"delete"},
    VmState.RUNNING: {"stop", "reboot", "reset", "power_off", "shelve", "delete"},
    VmState.STOPPED: {"start", "shelve", "delete"},
    VmState.ERROR: {"delete"},
    VmState.EVICTING: {"delete"},
    VmState.EVICTED: {"start", "delete"},
    VmState.SHELVING: {"delete"},
    VmState.SHELVED: {"unshelve", "delete"},
    VmState.DELETING: set(),
    VmState.DELETED: set(),
}


def desired_power(vm: VirtualMachine) -> str | None:
    """What the host should make of the guest now; None when no host work is wanted."""
    if vm.state in (VmState.DELETING, VmState.SHELVING):
        return DesiredPower.ABSENT
    if vm.task_state in (VmTask.STARTING, VmTask.REBOOTING, VmTask.RESETTING):
        return DesiredPower.RUNNING
    if vm.task_state == VmTask.POWERING_OFF:
        return DesiredPower.STOPPED
    if vm.state == VmState.EVICTING:
        # The guest runs out its notice, then stops (``compute.services.spot``).
        ended = vm.eviction_deadline is not None and vm.eviction_deadline <= timezone.now()
        stop = vm.task_state == VmTask.STOPPING or ended
        return DesiredPower.STOPPED if stop else DesiredPower.RUNNING
    if vm.task_state == VmTask.STOPPING or vm.state == VmState.STOPPED:
        return DesiredPower.STOPPED
    if vm.state in (VmState.PROVISIONING, VmState.RUNNING):
        return DesiredPower.RUNNING
    return None


def interfaces(vm: VirtualMachine) -> tuple[InterfaceWire, ...]:
    """The guest's NICs, in order, from its ports (``network``)."""
    from network.selectors import vm_interfaces

    return vm_interfaces(vm)


def storage(vm: VirtualMachine) -> dict:
    """The guest's attached volumes and the shares it mounts (``storage``)."""
    from storage.selectors import vm_mounts, vm_volumes

    return {"volumes": vm_volumes(vm), "mounts": vm_mounts(vm)}


# --- the root disk: booted from its image, or from the disk kept when it was shelved --------


def kept_disk_path(vm: VirtualMachine) -> str:
    """Where ``vm``'s root disk is kept once shelved (the same path on every host)."""
    return vm.kept_disk or str(PurePosixPath(settings.SHELVE_STORE) / f"{vm.pk}.qcow2")


def absent_extra(vm: VirtualMachine) -> dict:
    """What a host task that removes ``vm``'s guest must also do with its root disk: keep
    it (shelving) or, for a VM that booted from a kept disk and is deleted, remove it."""
    if vm.state == VmState.SHELVING:
        return {"keep_root_disk": kept_disk_path(vm)}
    if vm.state == VmState.DELETING and vm.kept_disk:
        return {"remove_root_disk": vm.kept_disk}
    return {}


def boot_extra(vm: VirtualMachine) -> dict:
    """What a host task that builds ``vm``'s guest needs to boot its kept disk."""
    return {"root_disk": vm.kept_disk} if vm.kept_disk else {}


def apply_message(vm: VirtualMachine, *, operation_id: str = "") -> VmApply:
    """The host task that converges ``vm``'s guest to what the database wants now."""
    desired = desired_power(vm)
    if desired == DesiredPower.ABSENT:
        return VmApply(
            vm_id=str(vm.pk),
            generation=vm.generation,
            desired=desired,
            operation_id=operation_id,
            graceful_timeout_s=settings.VM_STOP_GRACE_S,
            extra=absent_extra(vm),
        )  # a removal never expires: it is always safe
    devices = tuple(
        DeviceWire(
            address=d.pci_address,
            kind=d.kind,
            numa_node=d.numa_node,
            class_code=d.class_code,
            vendor_id=d.vendor_id,
            product_id=d.product_id,
        )
        for d in sorted(_devices(vm), key=lambda d: d.pci_address)
    )
    return VmApply(
        vm_id=str(vm.pk),
        generation=vm.generation,
        desired=desired,
        name=f"{vm.project.slug}/{vm.name}",
        hostname=vm.name,
        vcpus=vm.vcpus,
        memory_mib=vm.memory_mib,
        numa_cell=vm.numa_cell,
        devices=devices,
        image_location=vm.image.location,
        image_format=vm.image.format,
        **image_fetch(vm.image),
        disk_gib=vm.disk_gib,
        ssh_keys=tuple(vm.ssh_keys),
        user_data=vm.user_data,
        reboot=vm.task_state == VmTask.REBOOTING,
        reset=vm.task_state == VmTask.RESETTING,
        graceful_timeout_s=0
        if vm.task_state == VmTask.POWERING_OFF
        else settings.SPOT_STOP_GRACE_S
        if vm.state == VmState.EVICTING
        else settings.VM_STOP_GRACE_S,
        operation_id=operation_id,
        interfaces=interfaces(vm),
        extra={
            "metadata": {"url": settings.METADATA_URL, "token": vm.metadata_token},
            **boot_extra(vm),
        },
        expires_at=time.time() + settings.VM_APPLY_TTL_S,
        **storage(vm),
    )


def _devices(vm: VirtualMachine):
    """``vm``'s devices: those read with it (``prefetch_related("devices")``), or read now."""
    prefetched = getattr(vm, "_prefetched_objects_cache", {}).get("devices")
    return prefetched if prefetched is not None else _DEVICES.objects(vm.pk)


def read_devices(vm: VirtualMachine) -> None:
    """Read ``vm``'s devices now, as ``prefetch_related_objects([vm], "devices")`` would
    (``vm.devices.all()`` answers them, ``_devices`` reads nothing more), in the compiled
    read below: a placed VM's host is told its devices and its caller answered them."""
    prefetched(vm, "devices", _DEVICES.objects(vm.pk))


# Every message to a host that builds a guest reads its devices: compiled once.
_DEVICES = Compiled(lambda vm_id: Device.objects.filter(vm_id=vm_id), UUID)


def send_apply(vm: VirtualMachine, *, operation_id: str = "") -> None:
    """Send the host its work for ``vm`` once the current transaction commits."""
    if vm.host_id is None or desired_power(vm) is None:
        return
    message = apply_message(vm, operation_id=operation_id)
    agents.send_to_host(vm.host.name, VM_APPLY_TASK, **message.to_wire())


def vm_reapply(vm: VirtualMachine) -> VirtualMachine:
    """``vm`` (its row locked by the caller) changed outside its state (a volume attached or
    detached): bump its generation and send its host the new ``vm_apply``, which converges
    the guest, live when it runs."""
    VirtualMachine.objects.filter(pk=vm.pk).update(
        generation=F("generation") + 1, updated_at=timezone.now()
    )
    vm.refresh_from_db(fields=["generation"])
    send_apply(vm)
    return vm


def open_operation(vm: VirtualMachine, kind: str, actor) -> Operation:
    return operation_create(
        kind=kind,
        target=vm,
        project=vm.project,
        created_by=actor,
        deadline_s=settings.VM_OPERATION_DEADLINE_S,
    )


VM_TARGET = VirtualMachine._meta.label_lower  # an operation's ``target_type`` for a VM


def current_operation(vm: VirtualMachine) -> str:
    """The id of the newest operation on ``vm`` a host's answer may still finish: unfinished,
    or failed by the reaper's deadline alone (a late success overturns that;
    ``controlplane.services.operation_finish``)."""
    found = _CURRENT_OPERATION.tuples(str(vm.pk))
    return str(found[0][0]) if found else ""


# Every message about a VM that its host answers names that operation: compiled once
# (``controlplane.compiled``).
_CURRENT_OPERATION = Compiled(
    lambda target_id: (
        Operation.objects.filter(
            Q(state__in=[OperationState.PENDING, OperationState.RUNNING])
            | Q(state=OperationState.FAILED, error_code=DEADLINE_EXCEEDED),
            target_type=VM_TARGET,
            target_id=target_id,
        )
        .order_by("-created_at")
        .values_list("pk")[:1]
    ),
    str,
)


def supersede_operations(vm: VirtualMachine, by: str) -> None:
    """Finish every open operation on ``vm`` at once, failed as ``superseded``: the VM is
    being deleted, so nothing they asked for will happen (a create whose VM never launched,
    a start or stop overtaken by the delete)."""
    for (op_id,) in _OPEN_OPERATIONS.tuples(str(vm.pk)):
        operation_finish(
            operation_id=op_id,
            ok=False,
            error_code="superseded",
            error_message=f"the VM was deleted meanwhile ({by})",
            project=vm.project,
        )


# ``supersede_operations``'s read: every deletion makes it (compiled once).
_OPEN_OPERATIONS = Compiled(
    lambda target_id: Operation.objects.filter(
        state__in=[OperationState.PENDING, OperationState.RUNNING],
        target_type=VM_TARGET,
        target_id=target_id,
    ).values_list("pk"),
    str,
)


def require_active(project: Project) -> None:
    if project.status != ProjectStatus.ACTIVE:
        raise Conflict(
            f"project {project.slug} is {project.status}; nothing new may start in it",
            details={"project": [project.status]},
        )


def lock(vm: VirtualMachine) -> VirtualMachine:
    """Lock ``vm``'s row and re-read it, so the guard that follows judges the state as it is
    now: an internal transition committed meanwhile (provisioning → running) is seen, and
    one in flight is waited for, instead of failing the action with "changed meanwhile".
    Call inside the action's transaction; the lock is held until it commits. Its project
    and host are read with it (not locked), as every action needs them."""
    found = _LOCKED.objects(vm.pk)
    if not found:
        raise VirtualMachine.DoesNotExist("VirtualMachine matching query does not exist.")
    refresh_from(vm, found[0])
    return vm


# ``lock``'s read: what ``refresh_from_db`` would build and compile at every action.
_LOCKED = Compiled(
    lambda pk: (
        VirtualMachine.objects.select_for_update(of=("self",))
        .select_related("project", "host")
        .filter(pk=pk)
    ),
    UUID,
)


# Actions that may overrule one in flight: a guest hanging in a graceful stop or reboot
# can still be powered off, or reset.
OVERRULES = {
    "delete": {t for t in VmTask.values},
    "power_off": {VmTask.STOPPING, VmTask.REBOOTING, VmTask.RESETTING},
    "reset": {VmTask.REBOOTING},
}


def guard(vm: VirtualMachine, action: str) -> None:
    allowed = ACTIONS.get(vm.state, set())
    if action not in allowed or (vm.task_state and vm.task_state not in OVERRULES.get(action, ())):
        doing = f" ({vm.task_state} in progress)" if vm.task_state else ""
        raise Conflict(
            f"vm {vm.name} is {vm.state}{doing}; cannot {action} it",
            code="invalid_state",
            details={"state": [vm.state], "task_state": [vm.task_state]},
        )


def transition(vm: VirtualMachine, **changes) -> VirtualMachine:
    """Apply ``changes`` and bump the generation, if and only if nobody changed the VM since
    it was read: the second of two racing actions gets 409. The VM's usage intervals follow
    its new state in the same transaction (``tenants.usage``), at the same instant: read
    and written only where what it bills changed."""
    now = timezone.now()
    updated = update_where(
        VirtualMachine,
        {"pk": vm.pk, "generation": vm.generation, "state": vm.state, "task_state": vm.task_state},
        {**changes, "generation": vm.generation + 1, "updated_at": now},
    )
    if not updated:
        current = VirtualMachine.objects.filter(pk=vm.pk).values("state", "task_state").first()
        state = current["state"] if current else VmState.DELETED
        raise Conflict(
            f"vm {vm.name} changed meanwhile and is now {state}; try again",
            code="invalid_state",
            details={"state": [state]},
        )
    billed = usage.vm_usage_wanted(vm)
    for name, value in changes.items():
        setattr(vm, name, value)
    vm.generation += 1
    usage.vm_usage_sync(vm, at=now, before=billed)
    return vm


def place(vm: VirtualMachine, *, claimed: bool = False) -> None:
    """Claim a host for ``vm`` (unless ``claimed``: its claim is written already) and bind
    its ports there (raises NoValidHost)."""
    from network import services as network

    if not claimed:
        placement.place(vm)
    network.ports_bind(vm)


def requeue(vm: VirtualMachine, *, action: str, kind: str, actor) -> tuple[Operation, bool]:
    """A VM that holds no claim (evicted, shelved) asks for one again, as a new request:
    its quota is claimed again (409 when the project used it meanwhile), it turns pending
    and is placed where it fits. Returns its operation and whether it was placed; when
    nothing fits it waits, with the reason. ``vm`` is updated in place."""
    require_active(vm.project)
    guard(vm, action)
    quotas.check(
        vm.project,
        vms=1,
        vcpus=vm.vcpus,
        memory_gib=-(-vm.memory_mib // 1024),
        gpus=vm.gpus,
    )
    transition(
        vm,
        state=VmState.PENDING,
        task_state=VmTask.NONE,
        eviction_notice_at=None,
        eviction_deadline=None,
        eviction_acknowledged_at=None,
        state_reason="waiting for capacity",
    )
    operation = open_operation(vm, kind, actor)
    try:
        place(vm)
    except NoValidHost as e:
        VirtualMachine.objects.filter(pk=vm.pk).update(state_reason=e.reason[:500])
        vm.state_reason = e.reason[:500]
        return operation, False
    return operation, True
