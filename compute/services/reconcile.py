"""What host agents report, and the work that makes hosts match the database again.

- ``inventory_reported``: a host's CPUs, memory, NUMA cells and devices.
- ``vm_observed``: the outcome of one ``vm_apply`` on a host.
- ``guests_reported``: every Kumo guest a host holds, sent periodically and at agent start.
  Drift is re-issued (a placed VM whose guest is missing or behind its generation), and a
  guest no live VM accounts for is an orphan, destroyed after ``KUMO_ORPHAN_GRACE_S``.
- ``vms_reap_stuck``: a VM still provisioning past its deadline is marked error.

A message lost anywhere (broker restart, agent killed mid-task) therefore delays
convergence by one report interval; it never loses what a user asked for.
"""

import logging
import uuid
from contextlib import nullcontext
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from compute import placement
from compute.choices import DesiredPower, DeviceKind, PowerState, VmState, VmTask
from compute.gpus import device_model
from compute.models import Device, Host, OrphanGuest, VirtualMachine
from compute.protocol import ABSENT, GUESTS_LIST_TASK, VM_APPLY_TASK, VM_DESCRIBE_TASK, VmApply
from compute.services import reclaim, shelve, spot, steady
from compute.services.lifecycle import current_operation, desired_power, send_apply
from compute.services.vms import vm_finish_delete
from controlplane import agents, audit, events
from controlplane.compiled import update_where
from controlplane.errors import Conflict
from controlplane.rowjoin import JoinedLookup, RowLookup, pk_param
from controlplane.services import operation_create, operation_finish
from tenants import usage

log = logging.getLogger(__name__)

_POWER = {p.value for p in PowerState}


# --- inventory -----------------------------------------------------------------------------------


@transaction.atomic
def inventory_reported(*, host: str, payload: dict, sent_at: datetime) -> Host:
    """Record a host's inventory. Devices are matched by PCI address: new ones are added,
    known ones updated, missing ones marked not present (never deleted while a VM holds
    them). A report older than the last one recorded changes nothing."""
    obj, _created = Host.objects.select_for_update().get_or_create(name=host)
    if obj.inventory_reported_at is not None and sent_at <= obj.inventory_reported_at:
        return obj
    obj.vcpus = int(payload.get("cpus", 0))
    obj.memory_mib = int(payload.get("memory_mib", 0))
    obj.numa_cells = list(payload.get("cells", []))
    obj.hypervisor = str(payload.get("hypervisor", ""))[:32]
    obj.guest_accel = str(payload.get("accel", ""))[:8]
    obj.inventory_reported_at = sent_at
    obj.save()

    known = {d.pci_address: d for d in Device.objects.filter(host=obj)}
    seen = set()
    created, updated = [], []
    fields = [
        "name",
        "kind",
        "model",
        "vendor_id",
        "product_id",
        "class_code",
        "vendor_name",
        "product_name",
        "numa_node",
        "iommu_group",
        "physical_function",
        "present",
    ]
    for item in payload.get("devices", []):
        if item.get("kind") not in DeviceKind.values:
            continue
        address = item["address"]
        seen.add(address)
        values = {
            "name": item.get("name", "")[:64],
            "kind": item["kind"],
            "model": device_model(item.get("vendor_id", 0), item.get("product_id", 0)),
            "vendor_id": item.get("vendor_id", 0),
            "product_id": item.get("product_id", 0),
            "class_code": item.get("class_code", 0),
            "vendor_name": item.get("vendor_name", "")[:128],
            "product_name": item.get("product_name", "")[:128],
            "numa_node": item.get("numa_node"),
            "iommu_group": item.get("iommu_group"),
            "physical_function": item.get("physical_function") or "",
            "present": True,
        }
        device = known.get(address)
        if device is None:
            created.append(Device(host=obj, pci_address=address, **values))
        elif any(getattr(device, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(device, k, v)
            updated.append(device)
    Device.objects.bulk_create(created)
    Device.objects.bulk_update(updated, fields)
    gone = Device.objects.filter(host=obj, present=True).exclude(pci_address__in=seen)
    gone_count = gone.update(present=False)
    if created or updated or gone_count:
        audit.record(
            "host.inventory",
            obj,
            detail={
                "added": len(created),
                "changed": len(updated),
                "gone": gone_count,
                "vcpus": obj.vcpus,
                "memory_mib": obj.memory_mib,
            },
        )
        transaction.on_commit(placement.view.invalidate, robust=True)
    return obj


# --- observed state ------------------------------------------------------------------------------


def _settle(vm: VirtualMachine, generation: int, power: str, now: datetime) -> dict:
    """The fields that follow from the host observing ``power`` at ``generation``."""
    changes: dict = {"power_state": power, "power_observed_at": now}
    if generation > vm.applied_generation and power != ABSENT:
        changes["applied_generation"] = generation
    if generation < vm.generation:
        return changes  # a newer change is on its way to the host
    if vm.state == VmState.EVICTING:
        # Evicting stays so, running out its notice or shut off, until every victim of its
        # hand-over is off (``compute.services.spot.evictions_hand_over`` evicts them all).
        return changes
    desired = desired_power(vm)
    if desired == DesiredPower.RUNNING and power == PowerState.RUNNING:
        changes.update(state=VmState.RUNNING, task_state=VmTask.NONE, state_reason="")
        if vm.launched_at is None:
            changes["launched_at"] = now
        if vm.state != VmState.RUNNING:
            changes["running_since"] = now  # booted: its guest starts from what it saved
    elif desired == DesiredPower.STOPPED and power == PowerState.SHUTOFF:
        changes.update(state=VmState.STOPPED, task_state=VmTask.NONE, state_reason="")
    elif (
        vm.state == VmState.RUNNING
        and not vm.task_state
        and power in (PowerState.SHUTOFF, PowerState.CRASHED)
    ):
        # The guest powered itself off (or crashed): the VM is stopped, as Nova syncs it.
        changes.update(state=VmState.STOPPED, state_reason=f"the guest was found {power}")
    return changes


def _finish_operation(operation_id: str, *, vm: VirtualMachine, ok: bool, error: str = ""):
    if operation_id:
        operation_finish(
            operation_id=operation_id,
            ok=ok,
            result={"state": vm.state, "power_state": vm.power_state},
            error_code="" if ok else "host_error",
            error_message=error,
            project=vm.project,
        )


# Every report of every host reads these two rows, locked: their SQL is built once per
# process (``controlplane.rowjoin``), not compiled by the ORM for each report. The same rows,
# locks and objects as ``Host.objects.select_for_update(no_key=True).filter(name=...)`` and
# ``VirtualMachine.objects.select_for_update(of=("self",)).select_related("project")``.
_HOST_LOCK = RowLookup(Host, where='m."name" = %s', lock="FOR NO KEY UPDATE OF m")
_VM_LOCK = JoinedLookup(VirtualMachine, "project", 'm."id" = %s', lock="FOR UPDATE OF m")


def _reporting_host(name: str) -> Host | None:
    found = _HOST_LOCK.first(name)
    return None if found is None else found["m"]


def _reported_vm(vm_id) -> VirtualMachine | None:
    """The VM ``vm_id`` (as a report names it) with its project, its row locked; None for
    no id or no such VM. An id that is no UUID is refused as the ORM refuses it."""
    if vm_id is None:
        return None
    return _VM_LOCK.first(pk_param(VirtualMachine, vm_id, connection))


@transaction.atomic
def vm_observed(*, host: str, payload: dict, sent_at: datetime) -> VirtualMachine | None:
    """The outcome of one ``vm_apply``: the guest's generation and power, or the error the
    host met. Moves the VM to the state it reached and finishes the operation; an evicting
    VM's guest found off may complete its hand-over (``spot.evictions_hand_over``).

    Locks the reporting host's row, then the VM: the order of the guests report."""
    host_row = _reporting_host(host)
    vm = _reported_vm(payload.get("vm_id"))
    operation_id = payload.get("operation_id", "")
    on_host = host_row is not None and vm is not None and vm.host_id == host_row.pk
    if not on_host or vm.state == VmState.DELETED:
        if operation_id:
            operation_finish(operation_id=operation_id, ok=True, result={"state": "deleted"})
        return None  # a guest no VM accounts for: the guests report handles orphans
    vm.host = host_row  # its host: the row locked above, not read twice
    generation = int(payload.get("generation", 0))
    power = payload.get("power") if payload.get("power") in _POWER else PowerState.UNKNOWN
    now = timezone.now()
    # Older than an observation already recorded: a report delivered again, or handled after
    # a newer one by another thread. What it says of the guest no longer holds.
    stale = generation < vm.applied_generation
    if not payload.get("ok", True):
        error = str(payload.get("error", "the host failed"))[:500]
        if not stale:  # the failure is recorded either way; the VM's reason is the newer one's
            changes: dict = {"state_reason": error}
            if generation >= vm.generation:
                if vm.state == VmState.PROVISIONING:
                    changes["state"] = VmState.ERROR
                changes["task_state"] = VmTask.NONE
            update_where(VirtualMachine, {"pk": vm.pk}, {**changes, "updated_at": now})
            for k, v in changes.items():
                setattr(vm, k, v)
            usage.vm_usage_sync(vm, at=now)
            if changes.get("state") == VmState.ERROR:  # its project hears of it (webhooks)
                events.emit(
                    "vm.error",
                    project=vm.project,
                    obj=vm,
                    message=f"VM {vm.name} could not be made on its host: {error}",
                    payload={"error": error},
                )
        audit.record("vm.host_error", vm, project=vm.project, detail={"error": error})
        log.warning("vm %s generation %d: host %s failed: %s", vm.pk, generation, host, error)
        _finish_operation(operation_id, vm=vm, ok=False, error=error)
        return vm
    if vm.state == VmState.DELETING and power == ABSENT and generation >= vm.generation:
        # A victim's deletion may hand its host over, which takes savepoints: its records
        # are written as they are made. Any other's and its finished operation's, in one.
        with audit.batched() if vm.evicted_for_id is None else nullcontext():
            vm_finish_delete(vm)
            _finish_operation(operation_id, vm=vm, ok=True)
        return vm
    if vm.state == VmState.SHELVING and power == ABSENT and generation >= vm.generation:
        shelve.vm_finish_shelve(vm)
        _finish_operation(operation_id, vm=vm, ok=True)
        return vm
    if stale:
        return vm
    changes = _settle(vm, generation, power, now)
    update_where(VirtualMachine, {"pk": vm.pk}, {**changes, "updated_at": now})
    previous, billed = vm.state, usage.vm_usage_wanted(vm)
    for k, v in changes.items():
        setattr(vm, k, v)
    if vm.state != previous:
        usage.vm_usage_sync(vm, at=now, before=billed)
    evicting = vm.state == VmState.EVICTING and spot.shut_off(vm)
    # Without a hand-over (which takes savepoints, so its records are written as they are
    # made), the record of the move and that of the finished operation are one INSERT.
    with audit.batched() if not evicting else nullcontext():
        if vm.state != previous:
            audit.record(
                "vm.state",
                vm,
                project=vm.project,
                detail={"from": previous, "to": vm.state, "generation": generation},
            )
        if evicting and str(vm.pk) in spot.evictions_hand_over(host_row):
            vm.refresh_from_db()
            _finish_operation(operation_id, vm=vm, ok=True)
            return vm
        if generation >= vm.generation and not vm.task_state and vm.state != VmState.PROVISIONING:
            _finish_operation(operation_id, vm=vm, ok=True)
    return vm


# --- the periodic guests report ------------------------------------------------------------------


def guests_reported(*, host: str, payload: dict, sent_at: datetime) -> dict:
    """Compare what ``host`` holds with what the database wants, and act on the drift.

    Returns what it did: ``reissued`` (VM ids sent their work again), ``settled`` (VMs
    whose state followed the observation), ``orphans_destroyed``.

    ``sent_at`` is when the agent took the report. What it says of a VM changed after that
    (``updated_at``) is stale: it neither finishes a delete (the guest may have been built
    since), nor sends work again (the change sent its own), nor moves the VM's state (a
    guest seen shut off just before its start must not stop the VM its running report
    already moved); the next report decides.

    Almost every report of a fleet says what the database already holds:
    ``steady.guests_in_step`` recognizes those by comparing the report with the host's VMs,
    and records only the observation (CPU samples, the time) in two statements; any
    difference at all, on either side, takes the full comparison.
    """
    reported = {g["vm_id"]: g for g in payload.get("guests", [])}
    if steady.guests_in_step(host, reported, sent_at):
        return {"reissued": [], "settled": [], "orphans_destroyed": []}
    return _reconcile_guests(host=host, reported=reported, sent_at=sent_at)


@transaction.atomic
def _reconcile_guests(*, host: str, reported: dict, sent_at: datetime) -> dict:
    """The full comparison of ``guests_reported``: every VM of the host locked and compared
    with its guest, drift sent again, orphans counted and destroyed."""
    # The host row, then its VMs by primary key: the lock order of every writer of a
    # host's VMs (``compute.services.spot.evictions_hand_over``).
    obj = Host.objects.select_for_update(no_key=True).filter(name=host).first()
    if obj is None or (obj.guests_reported_at and sent_at <= obj.guests_reported_at):
        return {"reissued": [], "settled": [], "orphans_destroyed": []}
    now = timezone.now()
    grace = timedelta(seconds=settings.RECONCILE_GRACE_S)
    done: dict[str, list[str]] = {"reissued": [], "settled": [], "orphans_destroyed": []}

    vms = (
        VirtualMachine.objects.select_for_update(of=("self",))
        .select_related("project", "host", "image")
        .prefetch_related("devices")
        .filter(host=obj)
        .exclude(state__in=[VmState.DELETED, VmState.PENDING])
        .order_by("pk")
    )
    accounted = set()
    for vm in vms:
        vm_id = str(vm.pk)
        guest = reported.get(vm_id)
        desired = desired_power(vm)
        if guest is not None and vm.state != VmState.ERROR:
            accounted.add(vm_id)
        if desired is None:
            continue
        if sent_at < vm.updated_at:
            # Taken before the VM's last change: what it saw may be what that change undid
            # (a guest seen off just before the start whose report came first), so it
            # moves nothing. The next report decides.
            continue
        if guest is None and vm.state == VmState.SHELVING:
            shelve.vm_finish_shelve(vm)
            _finish_operation(current_operation(vm), vm=vm, ok=True)
            done["settled"].append(vm_id)
            continue
        if guest is None and desired == DesiredPower.ABSENT:
            vm_finish_delete(vm)
            _finish_operation(current_operation(vm), vm=vm, ok=True)
            done["settled"].append(vm_id)
            continue
        behind = guest is None or guest["generation"] < vm.generation
        if guest is not None:
            changes = _settle(vm, guest["generation"], guest["power"], now)
            changes.update(reclaim.cpu_observed(vm, guest.get("cpu_time_ns"), now))
            previous, billed = vm.state, usage.vm_usage_wanted(vm)
            update_where(VirtualMachine, {"pk": vm.pk}, {**changes, "updated_at": now})
            for k, v in changes.items():
                setattr(vm, k, v)
            if vm.state != previous:
                usage.vm_usage_sync(vm, at=now, before=billed)
                done["settled"].append(vm_id)
                if not vm.task_state:
                    _finish_operation(current_operation(vm), vm=vm, ok=True)
            if vm.state == VmState.EVICTING and spot.shut_off(vm):
                continue  # evicted below, with the rest of its hand-over
        if behind and now - vm.updated_at > grace:
            log.info(
                "vm %s generation %d: drift on %s (%s); work sent again",
                vm_id,
                vm.generation,
                host,
                "missing" if guest is None else "behind",
            )
            send_apply(vm, operation_id=current_operation(vm))
            done["reissued"].append(vm_id)

    done["settled"].extend(spot.evictions_hand_over(obj))

    # Guests no live VM accounts for: orphans, destroyed once they have stayed so a while.
    orphans = {o.vm_id: o for o in OrphanGuest.objects.select_for_update().filter(host=obj)}
    for vm_id in set(reported) - accounted:
        if (
            VirtualMachine.objects.filter(pk=_uuid_or_none(vm_id), host=obj)
            .exclude(state__in=[VmState.DELETED, VmState.ERROR])
            .exists()
        ):
            continue
        if VirtualMachine.objects.filter(
            pk=_uuid_or_none(vm_id),
            evicted_host=obj,
            state__in=[VmState.EVICTED, VmState.SHELVED],
        ).exists():
            continue  # an evicted VM's stopped guest: kept until it starts elsewhere
        gone = (
            VirtualMachine.objects.filter(pk=_uuid_or_none(vm_id), state=VmState.DELETED)
            .values_list("generation", "deleted_at")
            .first()
        )
        if gone is not None and gone[1] is not None and sent_at <= gone[1]:
            # Taken before its VM's deletion ended (a report the broker held back): the
            # guest it saw is the one the deletion took away. The next report decides.
            continue
        orphan = orphans.get(vm_id) or OrphanGuest.objects.create(
            host=obj, vm_id=vm_id, first_seen_at=now
        )
        # A guest seen after its VM was deleted came back (a late message): it holds
        # devices the VM gave back, so it goes at once, not after the orphan grace.
        deleted = gone[0] if gone is not None else None
        if deleted is not None or now - orphan.first_seen_at >= timedelta(
            seconds=settings.ORPHAN_GRACE_S
        ):
            message = VmApply(
                vm_id=vm_id,
                generation=max(reported[vm_id]["generation"], deleted or 0) + 1,
                desired=DesiredPower.ABSENT,
            )
            if deleted is not None:
                log.warning("vm %s: deleted, yet its guest runs on %s; destroyed now", vm_id, host)
            agents.send_to_host(host, VM_APPLY_TASK, **message.to_wire())
            orphan.destroy_sent_at = now
            orphan.save(update_fields=["destroy_sent_at"])
            audit.record("host.orphan_destroy", obj, detail={"vm_id": vm_id})
            done["orphans_destroyed"].append(vm_id)
    OrphanGuest.objects.filter(host=obj).exclude(vm_id__in=list(reported)).delete()
    obj.guests_reported_at = sent_at
    obj.save(update_fields=["guests_reported_at", "updated_at"])
    return done


def _uuid_or_none(value: str):
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


# --- stuck work ----------------------------------------------------------------------------------


def vms_reap_stuck(*, now: datetime | None = None) -> int:
    """A VM still provisioning ``KUMO_VM_OPERATION_DEADLINE_S`` after its last change is
    marked error, naming its host; a stuck stop, start or reboot is given up (task cleared).
    Deleting VMs are not reaped: the reconcile keeps asking their host until it answers."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.VM_OPERATION_DEADLINE_S)
    count = 0
    stuck = VirtualMachine.objects.filter(updated_at__lt=cutoff).filter(
        state=VmState.PROVISIONING
    ) | VirtualMachine.objects.filter(updated_at__lt=cutoff).exclude(task_state=VmTask.NONE)
    for pk in list(stuck.values_list("pk", flat=True)):
        with transaction.atomic():
            vm = (
                VirtualMachine.objects.select_for_update(of=("self",))
                .select_related("project", "host")
                .get(pk=pk)
            )
            if vm.updated_at >= cutoff:
                continue
            host = vm.host.name if vm.host else "its host"
            reason = f"no answer from {host} within {settings.VM_OPERATION_DEADLINE_S} s"
            changes = {"task_state": VmTask.NONE, "state_reason": reason, "updated_at": now}
            if vm.state == VmState.PROVISIONING:
                changes["state"] = VmState.ERROR
            VirtualMachine.objects.filter(pk=pk).update(**changes)
            vm.state = changes.get("state", vm.state)
            usage.vm_usage_sync(vm, at=now)
            audit.record("vm.stuck", vm, project=vm.project, detail={"reason": reason})
            count += 1
    return count


# --- diagnostics (operators) ---------------------------------------------------------------------


@transaction.atomic
def vm_describe(*, vm: VirtualMachine, actor=None):
    """Ask the VM's host for the guest as libvirt holds it (domain XML, power, generation)."""
    if vm.host_id is None:
        raise Conflict(f"vm {vm.name} is not placed on a host", details={"state": [vm.state]})
    # An operator's question, not the project's work: the operation is the operators' own.
    operation = operation_create(kind="vm.describe", target=vm, created_by=actor, deadline_s=60)
    agents.send_to_host(
        vm.host.name, VM_DESCRIBE_TASK, vm_id=str(vm.pk), operation_id=str(operation.pk)
    )
    return operation


@transaction.atomic
def host_guests_list(*, host: Host, actor=None):
    """Ask a host's agent for every Kumo guest it holds, read from libvirt."""
    operation = operation_create(kind="host.guests", target=host, created_by=actor, deadline_s=60)
    agents.send_to_host(host.name, GUESTS_LIST_TASK, operation_id=str(operation.pk))
    return operation
