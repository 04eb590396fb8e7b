"""Reservations (OpenStack Blazar's leases, GCP's calendar reservations): a project holds
``gpus`` GPUs of a model over ``[starts_at, ends_at)``.

What a lease holds, and when:

- **Admitted** (``lease_create``): the fleet must hold it at every instant of its period,
  beside what is already promised: per project the larger of its guaranteed minimum and
  what its on-demand VMs hold now (they have no end), and every other lease overlapping
  it. Refused with 409 and the earliest period of the same length that fits (if any does
  while today's on-demand use lasts). Decided under the same transaction locks as
  guarantees and on-demand admission (``compute.guarantees``), so two admissions never
  both count on the same GPU; from then on, on-demand VMs of every project are admitted
  only while they leave room for the leases to come. (On-demand admission takes that lock
  only once some lease or guarantee of the model exists: an on-demand claim in flight
  while the very first one is admitted is not counted by it. If that leaves the lease
  short when it takes hold of its GPUs, ``lease.at_risk`` says so.)
- **Preparing** (``KUMO_LEASE_LEAD_S`` before its start, ``leases_tick``): it takes hold of
  real GPUs, free ones first, then ones spot VMs use. Each held GPU is a
  ``LeaseAllocation`` row over the lease's period (on PostgreSQL an exclusion constraint
  refuses a second lease on a GPU over an overlapping period) and ``Device.lease`` keeps
  every VM outside the lease off it. The spot VMs on those GPUs get their eviction notice
  now, so the GPUs are free at the start, not after it.
- **Active** (from its start): the project's VMs created "in" the lease
  (``VirtualMachine.lease``) are placed on its GPUs and nowhere else; before the start they
  wait, pending. Its bill runs: every GPU it holds, used or not, at the rate card's
  ``reserved`` factor; its VMs pay their vCPUs and memory at that factor and no GPU of
  their own.
- **Ending** (``KUMO_LEASE_LEAD_S`` before its end): its project is told (an event, mail
  and webhooks) which VMs will be shelved.
- **Ended** (at its end, or when cancelled): its running VMs are shelved (their disks are
  kept; unshelved later they are ordinary requests), the ones still waiting become
  ordinary requests, its GPUs are let go and its bill stops.

Every step is a row in the database that ``leases_tick`` (beat) reads, so a controller
restarted mid-way carries on where it was.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from compute import guarantees, placement
from compute.choices import DeviceKind, HostState, LeaseState, Priority, VmState, VmTask
from compute.leases import HOLDING
from compute.models import Device, Host, Lease, LeaseAllocation, VirtualMachine
from controlplane import audit, events
from controlplane.errors import Conflict, InvalidInput, PermissionDenied
from tenants import usage
from tenants.choices import BillingPriority, UsageResource

log = logging.getLogger(__name__)


def _lead() -> timedelta:
    return timedelta(seconds=settings.LEASE_LEAD_S)


# --- admission --------------------------------------------------------------------------------


def _fits(model: str, gpus: int, start: datetime, end: datetime, *, fleet: int, base: int):
    return base + guarantees.leased_peak(model, start, end) + gpus <= fleet


def earliest_fit(
    model: str, gpus: int, start: datetime, end: datetime, *, fleet: int, base: int
) -> datetime | None:
    """The earliest start, at or after ``start``, of a period as long as ``[start, end)``
    that fits; None when none does (what is promised now leaves too little)."""
    if base + gpus > fleet:
        return None
    length = end - start
    candidates = sorted(
        {start} | {e for _s, e, _n in guarantees.lease_intervals(model, start) if e > start}
    )
    for candidate in candidates:
        if _fits(model, gpus, candidate, candidate + length, fleet=fleet, base=base):
            return candidate
    return None  # unreachable while the last lease's end is a candidate


def _check(project, name: str, gpus, starts_at, ends_at, now) -> None:
    if not isinstance(gpus, int) or gpus < 1:
        raise InvalidInput.field("gpus", "must be 1 or more")
    if ends_at <= starts_at:
        raise InvalidInput.field("ends_at", "must be after starts_at")
    if ends_at <= now:
        raise InvalidInput.field("ends_at", "must be in the future")
    if starts_at < now - timedelta(minutes=5):
        raise InvalidInput.field("starts_at", "must not be in the past")
    longest = timedelta(days=settings.LEASE_MAX_DAYS)
    if ends_at - starts_at > longest:
        raise InvalidInput.field("ends_at", f"a lease lasts {settings.LEASE_MAX_DAYS} days at most")
    if Lease.objects.for_project(project).filter(name=name, state__in=HOLDING).exists():
        raise Conflict(
            f"a lease named {name} exists in project {project.slug}", details={"name": ["taken"]}
        )


def lease_create(
    *,
    project,
    name: str,
    gpus: int,
    starts_at: datetime,
    ends_at: datetime,
    gpu_model: str = "",
    actor=None,
) -> Lease:
    """Reserve ``gpus`` GPUs of ``gpu_model`` for ``project`` over ``[starts_at, ends_at)``;
    409 with the earliest period that fits when the fleet cannot hold it."""
    from compute.services.lifecycle import require_active

    require_active(project)
    now = timezone.now()
    _check(project, name, gpus, starts_at, ends_at, now)
    starts_at = max(starts_at, now)
    with transaction.atomic():
        # The locks of guarantee_set, then of on-demand admission of the model: a lease,
        # a guarantee and an on-demand VM are never decided on the same count at once.
        guarantees._advisory_lock(guarantees._SET_LOCK)
        models = guarantees.fleet_gpus(up_only=False)
        if not gpu_model:
            if len(models) != 1:
                raise InvalidInput.field(
                    "gpu_model", f"name one of the fleet's GPU models: {', '.join(sorted(models))}"
                )
            gpu_model = next(iter(models))
        if gpu_model not in models:
            raise InvalidInput.field("gpu_model", f"the fleet has no {gpu_model} GPUs")
        guarantees._advisory_lock(f"kumo.guarantee.gpu.{gpu_model}")
        fleet, base = models[gpu_model], guarantees.committed(gpu_model)
        if not _fits(gpu_model, gpus, starts_at, ends_at, fleet=fleet, base=base):
            _refuse(gpu_model, gpus, starts_at, ends_at, fleet=fleet, base=base)
        lease = Lease.objects.create(
            project=project,
            name=name,
            gpu_model=gpu_model,
            gpus=gpus,
            starts_at=starts_at,
            ends_at=ends_at,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        audit.record(
            "lease.create",
            lease,
            project=project,
            detail={
                "gpus": gpus,
                "gpu_model": gpu_model,
                "starts_at": starts_at.isoformat(),
                "ends_at": ends_at.isoformat(),
            },
        )
    return lease


def _refuse(model, gpus, start, end, *, fleet: int, base: int):
    later = earliest_fit(model, gpus, start, end, fleet=fleet, base=base)
    busy = guarantees.leased_peak(model, start, end)
    message = (
        f"{gpus} {model} GPUs do not fit from {start.isoformat()} to {end.isoformat()}: the "
        f"fleet has {fleet}, guarantees and on-demand VMs hold {base}, other leases up to {busy}"
    )
    details = {"gpus": [f"more than the fleet can reserve then ({fleet - base - busy} free)"]}
    if later is not None:
        message += f"; the earliest period that fits starts at {later.isoformat()}"
        details["earliest_starts_at"] = [later.isoformat()]
        details["earliest_ends_at"] = [(later + (end - start)).isoformat()]
    else:
        message += "; no period fits while today's on-demand use lasts"
    raise Conflict(message, code="no_capacity", details=details)


# --- cancel -----------------------------------------------------------------------------------


def lease_cancel(*, lease: Lease, actor=None) -> Lease:
    """Cancel: a lease not started yet is dropped (and billed nothing); a started one ends
    now, as at its end. Repeating it changes nothing."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update().select_related("project").get(pk=lease.pk)
        if lease.state not in HOLDING:
            return lease
        if actor is not None and getattr(actor, "is_authenticated", False):
            from tenants import services as tenants
            from tenants.choices import Role

            if not actor.is_staff and not Role.at_least(
                tenants.role_of(actor, lease.project), Role.ADMIN
            ):
                raise PermissionDenied("only the project's admins and operators cancel a lease")
        _finish(lease, state=LeaseState.CANCELLED, why="cancelled")
        audit.record("lease.cancel", lease, project=lease.project)
    return lease


# --- the tick: prepare, start, warn, end -------------------------------------------------------


def leases_tick(*, now: datetime | None = None) -> dict:
    """Beat's pass (and the replay's): each lease that is due moves on one step, each in
    its own transaction. Returns how many leases did what."""
    now = now or timezone.now()
    done = {"prepared": 0, "started": 0, "warned": 0, "ended": 0}
    live = Lease.objects.filter(state__in=HOLDING)
    for pk in live.filter(ends_at__lte=now).values_list("pk", flat=True):
        done["ended"] += _step(pk, lambda lease: _finish(lease, state=LeaseState.ENDED, at=now))
    due = live.filter(state=LeaseState.SCHEDULED, starts_at__lte=now + _lead(), ends_at__gt=now)
    for pk in due.values_list("pk", flat=True):
        done["prepared"] += _step(pk, lambda lease: _prepare(lease, now))
    due = live.filter(state=LeaseState.PREPARING, starts_at__lte=now, ends_at__gt=now)
    for pk in due.values_list("pk", flat=True):
        done["started"] += _step(pk, lambda lease: _start(lease, now))
    due = live.filter(
        state=LeaseState.ACTIVE, ends_at__lte=now + _lead(), end_notice_at__isnull=True
    )
    for pk in due.values_list("pk", flat=True):
        done["warned"] += _step(pk, lambda lease: _warn(lease, now))
    return done


def _step(pk, action) -> int:
    with transaction.atomic():
        lease = (
            Lease.objects.select_for_update(skip_locked=True)
            .select_related("project")
            .filter(pk=pk, state__in=HOLDING)
            .first()
        )
        if lease is None:
            return 0
        action(lease)
        return 1


def _prepare(lease: Lease, now: datetime) -> None:
    """Take hold of real GPUs for ``lease`` and give the spot VMs on them their notice."""
    guarantees._advisory_lock(f"kumo.guarantee.gpu.{lease.gpu_model}")
    chosen = _choose_devices(lease)
    # Lock order of every writer of a host's devices and VMs: the hosts, then the devices.
    for host_id in sorted({host_id for _, host_id in chosen}):
        Host.objects.select_for_update(no_key=True).filter(pk=host_id).exists()
    held = []
    rows = Device.objects.select_for_update(of=("self",)).filter(
        pk__in=[pk for pk, _ in chosen], lease__isnull=True
    )
    for device in rows.select_related("vm").order_by("pk"):
        if device.vm is None or device.vm.priority == Priority.SPOT:
            held.append(device)
    try:
        with transaction.atomic():
            LeaseAllocation.objects.bulk_create(
                LeaseAllocation(
                    lease=lease, device=d, starts_at=lease.starts_at, ends_at=lease.ends_at
                )
                for d in held
            )
    except IntegrityError:
        # Another lease took one of them over an overlapping period (the database's
        # constraint said so): the next tick chooses again.
        log.warning("lease %s: a chosen GPU was taken meanwhile; choosing again", lease.pk)
        return
    Device.objects.filter(pk__in=[d.pk for d in held]).update(lease=lease)
    transaction.on_commit(placement.view.invalidate, robust=True)  # its GPUs are no one's
    noticed = _notify_spot([d.vm for d in held if d.vm is not None], lease, now)
    lease.state = LeaseState.PREPARING
    lease.state_reason = (
        f"holding {len(held)} of {lease.gpus} GPUs" if len(held) < lease.gpus else ""
    )
    lease.save(update_fields=["state", "state_reason"])
    audit.record(
        "lease.prepare",
        lease,
        project=lease.project,
        detail={"gpus_held": len(held), "spot_noticed": noticed},
    )
    if len(held) < lease.gpus:
        _at_risk(lease, len(held))


def _choose_devices(lease: Lease) -> list[tuple[int, int]]:
    """(device, host) pairs for ``lease``: GPUs of its model on hosts that are up, held by
    no lease over an overlapping period and by no VM but a spot one; whole hosts first
    (its VMs need whole cells), free GPUs before those spot VMs use."""
    overlapping = LeaseAllocation.objects.filter(
        starts_at__lt=lease.ends_at, ends_at__gt=lease.starts_at
    ).values("device_id")
    rows = (
        Device.objects.filter(
            kind=DeviceKind.GPU,
            model=lease.gpu_model,
            present=True,
            host__state=HostState.UP,
            lease__isnull=True,
        )
        .filter(Q(vm__isnull=True) | Q(vm__priority=Priority.SPOT))
        .exclude(pk__in=overlapping)
        .values_list("pk", "host_id", "vm_id", "numa_node", "pci_address")
        .order_by()
    )
    by_host: dict[int, list] = {}
    for row in rows:
        by_host.setdefault(row[1], []).append(row)
    hosts = sorted(
        by_host.values(),
        key=lambda devices: (-len(devices), sum(d[2] is not None for d in devices), devices[0][1]),
    )
    chosen = []
    for devices in hosts:
        for pk, host_id, _vm, _cell, _pci in sorted(
            devices, key=lambda d: (d[2] is not None, d[3] or 0, d[4])
        ):
            if len(chosen) == lease.gpus:
                return chosen
            chosen.append((pk, host_id))
    return chosen


def _notify_spot(vms: list[VirtualMachine], lease: Lease, now: datetime) -> int:
    """The eviction notice of each spot VM on the lease's GPUs (one that has one already
    keeps it). The notice ends before the lease starts."""
    from compute.services import spot

    noticed = 0
    for pk in sorted({vm.pk for vm in vms}):
        vm = (
            VirtualMachine.objects.select_for_update(of=("self",))
            .select_related("project", "template", "host")
            .filter(pk=pk, priority=Priority.SPOT, state__in=spot.EVICTABLE, task_state=VmTask.NONE)
            .first()
        )
        if vm is not None:
            spot.notify(vm, None, now, why=f"its GPUs are reserved from {lease.starts_at:%H:%M:%S}")
            noticed += 1
    return noticed


def _start(lease: Lease, now: datetime) -> None:
    lease.state = LeaseState.ACTIVE
    lease.save(update_fields=["state"])
    usage.usage_open(
        lease,
        UsageResource.GPU.value,
        lease.gpus,
        at=lease.starts_at,
        model=lease.gpu_model,
        priority=BillingPriority.RESERVED,
        name=f"lease {lease.name}",
    )
    audit.record("lease.start", lease, project=lease.project)
    events.emit(
        "lease.started",
        project=lease.project,
        obj=lease,
        message=f"lease {lease.name} started: {lease.gpus} {lease.gpu_model} GPUs until "
        f"{lease.ends_at.isoformat()}",
        payload={"lease": lease.pk, "ends_at": lease.ends_at.isoformat()},
    )


def _warn(lease: Lease, now: datetime) -> None:
    names = sorted(
        VirtualMachine.objects.filter(lease=lease)
        .exclude(state=VmState.DELETED)
        .values_list("name", flat=True)
    )
    lease.end_notice_at = now
    lease.save(update_fields=["end_notice_at"])
    events.emit(
        "lease.ending",
        project=lease.project,
        obj=lease,
        message=f"lease {lease.name} ends at {lease.ends_at.isoformat()}; its VMs "
        f"({', '.join(names) or 'none'}) will be shelved then",
        payload={"lease": lease.pk, "ends_at": lease.ends_at.isoformat(), "vms": names},
        mail=True,
    )


def _finish(lease: Lease, *, state: str, at: datetime | None = None, why: str = "ended") -> None:
    """End ``lease`` (its row locked): shelve its running VMs, release the waiting ones,
    let its GPUs go, stop its bill."""
    from compute.services import lifecycle
    from compute.services.shelve import vm_shelve

    now = timezone.now()
    at = min(at or now, lease.ends_at)
    for pk in (
        VirtualMachine.objects.filter(lease=lease)
        .exclude(state=VmState.DELETED)
        .order_by("pk")
        .values_list("pk", flat=True)
    ):
        vm = (
            VirtualMachine.objects.select_for_update(of=("self",))
            .select_related("project", "host", "image")
            .get(pk=pk)
        )
        reason = f"its lease {lease.name} {why}"
        shelve = vm.state in (VmState.RUNNING, VmState.STOPPED) and vm.task_state == VmTask.NONE
        # Out of the lease first: the shelve that follows is the VM's last change here, so
        # the host's work carries its final generation.
        vm = lifecycle.transition(vm, lease=None, state_reason=reason)
        if shelve:
            vm_shelve(vm=vm)
    if Device.objects.filter(lease=lease).update(lease=None):
        transaction.on_commit(placement.view.invalidate, robust=True)
    LeaseAllocation.objects.filter(lease=lease, ends_at__gt=at).update(ends_at=at)
    LeaseAllocation.objects.filter(lease=lease, starts_at__gte=at).delete()
    if lease.state == LeaseState.ACTIVE:
        usage.usage_close(lease, UsageResource.GPU.value, at=at, model=lease.gpu_model)
    lease.state, lease.ended_at = state, at
    lease.save(update_fields=["state", "ended_at"])
    if state == LeaseState.ENDED:
        audit.record("lease.end", lease, project=lease.project)
    events.emit(
        f"lease.{state}",
        project=lease.project,
        obj=lease,
        message=f"lease {lease.name} {why}",
        payload={"lease": lease.pk},
    )


def _at_risk(lease: Lease, held: int) -> None:
    message = (
        f"lease {lease.name} holds {held} of its {lease.gpus} {lease.gpu_model} GPUs: "
        "hosts left service since it was admitted"
    )
    audit.record(
        "lease.at_risk",
        lease,
        project=lease.project,
        detail={"held": held, "gpus": lease.gpus},
    )
    events.emit("lease.at_risk", project=lease.project, obj=lease, message=message, mail=True)
    log.warning(message)
