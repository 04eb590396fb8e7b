"""Reservations (OpenStack Blazar's leases, GCP's calendar reservations): a project holds
``gpus`` GPUs of a model over ``[starts_at, ends_at)``, or ``hosts`` whole hosts of it
(every GPU of each; admission then counts hosts too: see "whole hosts" below).

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
  their own. A lease that lends its idle GPUs (``lend_idle``, the default) lets spot VMs
  that find no other room run on the GPUs its VMs leave idle
  (``compute.placement._place_borrowing``); a VM of the lease that needs them gives those
  borrowers their eviction notice and takes the GPUs when they have stopped
  (``compute.services.spot.preempt_for``): it waits at most one spot notice, and the GPUs
  stay the lease's throughout (``Device.lease``). Borrowers pay the spot price for what
  they use; the lease's bill is unchanged. Without ``lend_idle`` its idle GPUs run
  nothing and its VMs start at once.
- **Ending** (``KUMO_LEASE_LEAD_S`` before its end): its project is told (an event, mail
  and webhooks) which VMs will be shelved.
- **A host leaves service** (down, in maintenance or draining) while the lease holds GPUs
  there (``leases_tick``, while it is preparing or active): the lease takes hold of as
  many GPUs elsewhere (chosen as at its start, whole hosts for a lease of whole hosts, the
  spot VMs on them noticed) and lets go of those it held on that host, keeping only the
  ones its own VMs still use there (let go once those VMs leave it). So it holds its size
  in GPUs that can run something; its bill does not change. A lease that finds too few
  (and one that held too few at its start) tries again at every tick, keeping what it
  held meanwhile, and says so once (``lease.at_risk``) until its holding changes again.
  The GPUs it let go are anyone's once their host returns to service. (Of a lease of whole
  hosts, a host counts as lost only when it leaves service, not for a GPU of it gone.)
- **Ended** (at its end, or when cancelled): its running VMs are shelved (their disks are
  kept; unshelved later they are ordinary requests), the ones still waiting become
  ordinary requests, its GPUs are let go and its bill stops.
- **Its start moved** (``lease_update``), while it is scheduled: admitted again over its new
  period as a new lease would be, itself set aside.
- **Its end moved** (``lease_update``), at any time before it has ended: later, the time it
  adds is admitted as a new lease over ``[old end, new end)`` would be (409 with the latest
  end that fits); earlier, the time it cuts is given back. The GPUs it holds and its bill
  follow the end, and ``lease.ending`` is told again before the new one.
- **Its size changed** (``lease_update``, a lease of GPUs), at any time before it has
  ended: more is admitted as a new lease of the GPUs added over what is left of it would be
  (409 with the most that fit) and, once it holds GPUs, held at once (the spot VMs on them
  noticed); fewer lets go at once of GPUs its VMs do not use. Its bill follows from then.

Every step is a row in the database that ``leases_tick`` (beat) reads, so a controller
restarted mid-way carries on where it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from compute import guarantees, placement
from compute.choices import DeviceKind, HostState, LeaseState, Priority, VmState, VmTask
from compute.leases import HOLDING, waiting_for
from compute.models import Device, Host, Lease, LeaseAllocation, VirtualMachine
from controlplane import audit, events
from controlplane.errors import Conflict, InvalidInput, PermissionDenied
from tenants import usage
from tenants.choices import BillingPriority, UsageResource

log = logging.getLogger(__name__)


def _lead() -> timedelta:
    return timedelta(seconds=settings.LEASE_LEAD_S)


# --- admission --------------------------------------------------------------------------------


def _fits(model: str, gpus: int, start: datetime, end: datetime, *, fleet, base, exclude=None):
    return base + guarantees.leased_peak(model, start, end, exclude=exclude) + gpus <= fleet


def earliest_fit(model: str, start: datetime, end: datetime, fits) -> datetime | None:
    """The earliest start, at or after ``start``, of a period as long as ``[start, end)``
    for which ``fits(start, end)`` holds; None when none does (what is promised now leaves
    too little): the candidates are ``start`` and the end of each lease of ``model``."""
    length = end - start
    candidates = sorted(
        {start} | {e for _s, e, _n in guarantees.lease_intervals(model, start) if e > start}
    )
    for candidate in candidates:
        if fits(candidate, candidate + length):
            return candidate
    return None


# --- whole hosts ------------------------------------------------------------------------------
#
# A lease of whole hosts takes every GPU of each of its hosts. GPUs counted alone would admit
# one that finds no host whole at its start: other leases and on-demand VMs hold a few GPUs
# on every host. So while a lease of whole hosts is in question (asked for, or overlapping
# the one asked for), admission also counts hosts: the hosts on-demand work holds now or may
# take, and at each instant the hosts every lease takes (a lease of GPUs as many as its
# GPUs fill: it takes whole hosts first, ``_choose_devices``). An on-demand VM placed later
# is held to the same count when it would take a host no one held
# (``compute.guarantees.whole_hosts_refusal``, asked by ``compute.placement.place`` and
# ``compute.services.spot.preempt_for``); the counting lives there, beside the rest of what
# is promised over time.


@dataclass(frozen=True)
class _Hosts:
    """What admission counts in hosts of a model, read once per decision."""

    per_host: int
    total: int
    pinned: int

    @classmethod
    def read(cls, model: str) -> _Hosts | None:
        per_host = guarantees.gpus_per_host(model)
        if per_host is None:
            return None
        return cls(
            per_host=per_host,
            total=guarantees.gpu_hosts(model),
            pinned=guarantees.hosts_pinned(model, per_host),
        )

    def free(
        self, model: str, start: datetime, end: datetime, *, whole: bool, exclude=None
    ) -> int | None:
        """Hosts no one takes at any instant of ``[start, end)``; None when no lease of
        whole hosts is in question (``whole``: the one asked for is)."""
        taken, overlapping = guarantees.hosts_taken(
            model, self.per_host, start, end, exclude=exclude
        )
        if not (whole or overlapping):
            return None
        return self.total - self.pinned - taken


def _check(project, name: str, gpus, hosts, starts_at, ends_at, now) -> None:
    if (gpus is None) == (hosts is None):
        raise InvalidInput.field("gpus", "give gpus or hosts (whole hosts): one of the two")
    if gpus is not None and (not isinstance(gpus, int) or gpus < 1):
        raise InvalidInput.field("gpus", "must be 1 or more")
    if hosts is not None and (not isinstance(hosts, int) or hosts < 1):
        raise InvalidInput.field("hosts", "must be 1 or more")
    _check_period(starts_at, ends_at, now, new_start=True)
    if Lease.objects.for_project(project).filter(name=name, state__in=HOLDING).exists():
        raise Conflict(
            f"a lease named {name} exists in project {project.slug}", details={"name": ["taken"]}
        )


def _check_period(starts_at: datetime, ends_at: datetime, now: datetime, *, new_start: bool):
    """A lease's period ``[starts_at, ends_at)``, 400 naming the field when it cannot be:
    an end in the future and after the start, a start given anew not in the past (five
    minutes' grace), and no longer than ``KUMO_LEASE_MAX_DAYS``."""
    if ends_at <= now:
        raise InvalidInput.field("ends_at", "must be in the future")
    if ends_at <= starts_at:
        raise InvalidInput.field("ends_at", "must be after starts_at")
    if new_start and starts_at < now - timedelta(minutes=5):
        raise InvalidInput.field("starts_at", "must not be in the past")
    if ends_at - starts_at > timedelta(days=settings.LEASE_MAX_DAYS):
        raise InvalidInput.field("ends_at", f"a lease lasts {settings.LEASE_MAX_DAYS} days at most")


def lease_create(
    *,
    project,
    name: str,
    starts_at: datetime,
    ends_at: datetime,
    gpus: int | None = None,
    hosts: int | None = None,
    gpu_model: str = "",
    lend_idle: bool = True,
    actor=None,
) -> Lease:
    """Reserve ``gpus`` GPUs of ``gpu_model``, or ``hosts`` whole hosts of it, for
    ``project`` over ``[starts_at, ends_at)``; 409 with the earliest period that fits when
    the fleet cannot hold it. ``lend_idle``: spot VMs may run on its GPUs while its own
    VMs leave them idle (see "Active" above)."""
    from compute.services.lifecycle import require_active

    require_active(project)
    now = timezone.now()
    _check(project, name, gpus, hosts, starts_at, ends_at, now)
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
        whole = _Hosts.read(gpu_model)
        if hosts is not None:
            if whole is None:
                raise InvalidInput.field(
                    "hosts",
                    f"the fleet's {gpu_model} hosts hold different numbers of GPUs: "
                    "reserve GPUs instead",
                )
            gpus = hosts * whole.per_host
        fleet, base = models[gpu_model], guarantees.committed(gpu_model)
        asked = _Asked(gpu_model, gpus, hosts, fleet, base, whole)
        if not asked.fits(starts_at, ends_at):
            asked.refuse(starts_at, ends_at)
        lease = Lease.objects.create(
            project=project,
            name=name,
            gpu_model=gpu_model,
            gpus=gpus,
            hosts=hosts,
            starts_at=starts_at,
            ends_at=ends_at,
            lend_idle=lend_idle,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        detail = {
            "gpus": gpus,
            "gpu_model": gpu_model,
            "starts_at": starts_at.isoformat(),
            "ends_at": ends_at.isoformat(),
            "lend_idle": lend_idle,
        }
        if hosts is not None:
            detail["hosts"] = hosts
        audit.record("lease.create", lease, project=project, detail=detail)
    return lease


@dataclass(frozen=True)
class _Asked:
    """A lease asked for, and what its admission weighs (``exclude``: a lease moved, set
    aside while its new period is weighed)."""

    model: str
    gpus: int
    hosts: int | None
    fleet: int
    base: int
    whole: _Hosts | None
    exclude: Lease | None = None

    def hosts_free(self, start: datetime, end: datetime) -> int | None:
        if self.whole is None:
            return None
        whole = self.hosts is not None
        return self.whole.free(self.model, start, end, whole=whole, exclude=self.exclude)

    def hosts_needed(self) -> int:
        return self.hosts or -(-self.gpus // self.whole.per_host)

    def fits(self, start: datetime, end: datetime) -> bool:
        counted = {"fleet": self.fleet, "base": self.base, "exclude": self.exclude}
        if not _fits(self.model, self.gpus, start, end, **counted):
            return False
        free = self.hosts_free(start, end)
        return free is None or self.hosts_needed() <= free

    def shortfall(self, start: datetime, end: datetime) -> tuple[str, str, str]:
        """Why it does not fit over ``[start, end)``: a sentence, the field it is about
        (``gpus`` or ``hosts``) and that field's reason."""
        busy = guarantees.leased_peak(self.model, start, end, exclude=self.exclude)
        free = self.fleet - self.base - busy
        if free < self.gpus:
            message = (
                f"{self.gpus} {self.model} GPUs do not fit from {start.isoformat()} to "
                f"{end.isoformat()}: the fleet has {self.fleet}, guarantees and on-demand VMs "
                f"hold {self.base}, other leases up to {busy}"
            )
            return message, "gpus", f"more than the fleet can reserve then ({free} free)"
        hosts_free = self.hosts_free(start, end)
        taken = self.whole.total - self.whole.pinned - hosts_free
        message = (
            f"{self.hosts_needed()} whole {self.model} hosts do not fit from "
            f"{start.isoformat()} to {end.isoformat()}: the fleet has {self.whole.total}, "
            f"on-demand VMs and guarantees hold or may take {self.whole.pinned}, other "
            f"leases up to {taken}"
        )
        field = "hosts" if self.hosts is not None else "gpus"
        reason = f"more whole hosts than the fleet can reserve then ({hosts_free} free)"
        return message, field, reason

    def refuse(self, start: datetime, end: datetime):
        later = earliest_fit(self.model, start, end, self.fits)
        message, field, reason = self.shortfall(start, end)
        details = {field: [reason]}
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


# --- lending and the end, changed ---------------------------------------------------------------


def lease_update(
    *,
    lease: Lease,
    lend_idle: bool | None = None,
    starts_at: datetime | None = None,
    ends_at: datetime | None = None,
    gpus: int | None = None,
) -> Lease:
    """Change whether ``lease`` lends its idle GPUs (``lend_idle``), when it starts
    (``starts_at``) and ends (``ends_at``), how many GPUs it holds (``gpus``), or several, in
    one transaction; None leaves a value as it is.

    Lending: stopping gives the spot VMs borrowing its GPUs their eviction notice now, so
    the GPUs are idle again once it is over and the lease's VMs start at once from then; a
    VM of the lease that asks before takes them at the hand-over, as it would have.
    Starting lets spot VMs that find no other room borrow its idle GPUs while it is active.

    The end: moved later, the lease is admitted again for the time it adds, as a new lease
    of its size over ``[its end, ends_at)`` would be (409 with the latest end that fits, when
    the fleet cannot hold it to ``ends_at``); the GPUs it holds, it holds on. Moved earlier
    (still in the future), it gives back the time it cut, and its bill stops then. Either
    way its project is told before the new end (``lease.ending``), as before the old.

    The start, of a lease that holds no GPUs yet (scheduled; 409 ``lease_started`` after):
    the lease is admitted again over its new period as a new lease would be, itself set
    aside (409 with the earliest period that fits); the VMs waiting in it wait on.

    Its size (a lease of GPUs; whole hosts keep theirs): more GPUs are admitted as a new
    lease of the GPUs added over what is left of it would be (409 with the most that fit);
    one that holds GPUs already takes hold of the added ones at once (the spot VMs on them
    get their notice). Fewer: the GPUs its VMs do not use go back at once (409 when its VMs
    use more than that, or one of them needs more). Its bill follows from now. Shrinking
    is done before the period moves, growing after, so each is admitted over the period it
    will hold.

    A lease that has ended is refused (409); the same values again change nothing and
    record nothing."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update().select_related("project").get(pk=lease.pk)
        if lease.state not in HOLDING:
            raise Conflict(
                f"lease {lease.name} is {lease.state}: it holds no GPUs to change",
                code="lease_ended",
                details={"state": [lease.state]},
            )
        changed = {}
        resize = gpus is not None and gpus != lease.gpus
        if resize and gpus < lease.gpus:
            changed |= _resize(lease, gpus)
        if starts_at is not None and starts_at != lease.starts_at:
            changed |= _move_start(lease, starts_at, ends_at or lease.ends_at)
        elif ends_at is not None and ends_at != lease.ends_at:
            changed |= _move_end(lease, ends_at)
        if resize and gpus > lease.gpus:
            changed |= _resize(lease, gpus)
        if lend_idle is not None and lend_idle != lease.lend_idle:
            changed |= _change_lending(lease, lend_idle)
        if changed:
            audit.record("lease.update", lease, project=lease.project, detail=changed)
    return lease


def _change_lending(lease: Lease, lend_idle: bool) -> dict:
    lease.lend_idle = lend_idle
    lease.save(update_fields=["lend_idle"])
    noticed = 0
    if lease.state == LeaseState.ACTIVE:
        # The scheduler's view reads whether some lease lends (``_CachedView.lends``).
        transaction.on_commit(placement.view.invalidate, robust=True)
        if not lend_idle:
            noticed = _notice_borrowers(lease)
    return {"lend_idle": lend_idle, "spot_noticed": noticed}


def _move_end(lease: Lease, ends_at: datetime) -> dict:
    """End ``lease`` (its row locked) at ``ends_at`` instead: admitted again for the time
    it adds; its GPUs' allocations follow."""
    _check_period(lease.starts_at, ends_at, timezone.now(), new_start=False)
    before = lease.ends_at
    if ends_at > before:
        _admit_extension(lease, before, ends_at)
    # The GPUs it holds, it holds to the new end (those it let go of stay let go). No other
    # lease holds one of them later: a lease takes hold only of GPUs no lease holds
    # (``Device.lease``), so none took these while this one held them (and on PostgreSQL
    # the exclusion constraint stands behind it).
    LeaseAllocation.objects.filter(lease=lease, ends_at=before).update(ends_at=ends_at)
    lease.ends_at, lease.end_notice_at = ends_at, None  # told again before the new end
    lease.save(update_fields=["ends_at", "end_notice_at"])
    _announce(
        lease,
        f"lease {lease.name} now ends at {ends_at.isoformat()} (it ended at {before.isoformat()})",
        ends_at=ends_at.isoformat(),
        was=before.isoformat(),
    )
    return {"ends_at": ends_at.isoformat(), "previous_ends_at": before.isoformat()}


def _admission(lease: Lease, gpus: int, hosts: int | None, *, exclude=None) -> _Asked:
    """What admitting ``gpus`` GPUs (or ``hosts`` whole hosts) of ``lease``'s model for it
    weighs, read under the locks ``lease_create`` takes (guarantees', then the model's
    on-demand admission): no two admissions count on the same GPU."""
    model = lease.gpu_model
    guarantees._advisory_lock(guarantees._SET_LOCK)
    guarantees._advisory_lock(f"kumo.guarantee.gpu.{model}")
    fleet = guarantees.fleet_gpus(up_only=False).get(model, 0)
    base, whole = guarantees.committed(model), _Hosts.read(model)
    return _Asked(model, gpus, hosts, fleet, base, whole, exclude=exclude)


def _announce(lease: Lease, message: str, **payload) -> None:
    """The event ``lease.updated`` for ``lease``'s project."""
    events.emit(
        "lease.updated",
        project=lease.project,
        obj=lease,
        message=message,
        payload={"lease": lease.pk, **payload},
    )


def _move_start(lease: Lease, starts_at: datetime, ends_at: datetime) -> dict:
    """Move ``lease`` (its row locked), which holds no GPUs yet, to ``[starts_at, ends_at)``,
    admitted again as a new lease there would be."""
    if lease.state != LeaseState.SCHEDULED:
        raise Conflict(
            f"lease {lease.name} is {lease.state}: it holds its GPUs from "
            f"{lease.starts_at.isoformat()}, and that start stays",
            code="lease_started",
            details={"starts_at": [f"the lease is {lease.state}"]},
        )
    now = timezone.now()
    _check_period(starts_at, ends_at, now, new_start=True)
    starts_at = max(starts_at, now)
    asked = _admission(lease, lease.gpus, lease.hosts, exclude=lease)
    if not asked.fits(starts_at, ends_at):
        asked.refuse(starts_at, ends_at)
    before = (lease.starts_at, lease.ends_at)
    lease.starts_at, lease.ends_at, lease.end_notice_at = starts_at, ends_at, None
    lease.save(update_fields=["starts_at", "ends_at", "end_notice_at"])
    waiting = VirtualMachine.objects.filter(lease=lease, state=VmState.PENDING)
    waiting.update(state_reason=waiting_for(lease))  # the start they wait for
    _announce(
        lease,
        f"lease {lease.name} now runs from {starts_at.isoformat()} to {ends_at.isoformat()} "
        f"(it ran from {before[0].isoformat()} to {before[1].isoformat()})",
        starts_at=starts_at.isoformat(),
        ends_at=ends_at.isoformat(),
        was=[before[0].isoformat(), before[1].isoformat()],
    )
    return {
        "starts_at": starts_at.isoformat(),
        "ends_at": ends_at.isoformat(),
        "previous_starts_at": before[0].isoformat(),
        "previous_ends_at": before[1].isoformat(),
    }


def _admit_extension(lease: Lease, start: datetime, end: datetime) -> None:
    """Admit ``lease``'s GPUs over ``[start, end)`` (its old end to its new one) as a new
    lease of its size there would be, under the same locks; 409 with the latest end that
    fits when they do not."""
    asked = _admission(lease, lease.gpus, lease.hosts)
    if asked.fits(start, end):
        return
    latest = _latest_fit(asked, start, end)
    message, _field, reason = asked.shortfall(start, end)
    message = f"lease {lease.name} cannot end at {end.isoformat()}: {message}; "
    details = {"ends_at": [reason]}
    if latest > start:
        message += f"the latest end that fits is {latest.isoformat()}"
        details["latest_ends_at"] = [latest.isoformat()]
    else:
        message += f"it cannot end later than {start.isoformat()} now"
    raise Conflict(message, code="no_capacity", details=details)


def _resize(lease: Lease, gpus: int) -> dict:
    """Make ``lease`` (its row locked) one of ``gpus`` GPUs from now on."""
    if lease.hosts is not None:
        raise InvalidInput.field(
            "gpus", "a lease of whole hosts keeps its hosts: reserve more in another lease"
        )
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidInput.field("gpus", "must be 1 or more")
    now = timezone.now()
    start, before = max(lease.starts_at, now), lease.gpus
    in_it = VirtualMachine.objects.filter(lease=lease).exclude(state=VmState.DELETED)
    largest = in_it.aggregate(most=Max("gpus"))["most"] or 0
    if largest > gpus:  # it could never be placed in the lease
        raise Conflict(
            f"lease {lease.name}: a VM in it needs {largest} GPUs, more than {gpus}",
            code="in_use",
            details={"gpus": [f"a VM in it needs {largest}"]},
        )
    holding = lease.state in (LeaseState.PREPARING, LeaseState.ACTIVE)
    noticed = 0
    if gpus > before:
        _admit_more(lease, gpus - before, start)
    lease.gpus = gpus
    if holding and gpus > before:
        noticed = _hold_more(lease, gpus - before, start, now)
    elif holding:
        _let_go(lease, gpus, now)
    if holding:
        held = Device.objects.filter(lease=lease).count()
        lease.state_reason = f"holding {held} of {gpus} GPUs" if held < gpus else ""
        if held < gpus and gpus > before:  # hosts left service since it was admitted
            _at_risk(lease, held)
    lease.save(update_fields=["gpus", "state_reason"])
    if lease.state == LeaseState.ACTIVE:  # its bill: the new size from now
        usage.usage_open(
            lease,
            UsageResource.GPU.value,
            gpus,
            at=now,
            model=lease.gpu_model,
            priority=BillingPriority.RESERVED,
            name=f"lease {lease.name}",
        )
    _announce(
        lease,
        f"lease {lease.name} now holds {gpus} {lease.gpu_model} GPUs (it held {before})",
        gpus=gpus,
        was=before,
    )
    return {"gpus": gpus, "previous_gpus": before, "spot_noticed": noticed}


def _admit_more(lease: Lease, more: int, start: datetime) -> None:
    """Admit ``more`` GPUs for ``lease`` over ``[start, its end)`` as a new lease of them
    there would be (the lease itself counted at its size), under the same locks; 409 with
    the most it may hold then."""
    asked = _admission(lease, more, None)
    if asked.fits(start, lease.ends_at):
        return
    message, _field, _reason = asked.shortfall(start, lease.ends_at)
    busy = guarantees.leased_peak(lease.gpu_model, start, lease.ends_at)  # this lease among them
    most = lease.gpus + max(0, asked.fleet - asked.base - busy)
    raise Conflict(
        f"lease {lease.name} cannot hold {lease.gpus + more} GPUs: {message} (this lease "
        f"{lease.gpus} of them); it may hold {most} then",
        code="no_capacity",
        details={"gpus": [f"more than the fleet can reserve then (at most {most})"]},
    )


def _hold_more(lease: Lease, more: int, start: datetime, now: datetime) -> int:
    """Take hold of ``more`` GPUs for ``lease``, which holds GPUs already; returns how many
    spot VMs on them got their notice."""
    held = _hold(lease, _choose_devices(lease, more, start), start)
    if held is None:
        raise Conflict(
            f"lease {lease.name}: a GPU it chose was taken meanwhile; try again",
            code="conflict",
        )
    why = f"its GPUs are reserved by a lease from {start:%H:%M:%S}"
    return _notify_spot([d.vm_id for d in held if d.vm_id is not None], now, why=why)


def _let_go(lease: Lease, gpus: int, now: datetime) -> None:
    """Hold at most ``gpus`` of the GPUs ``lease`` holds: let go of ones none of its VMs
    use, free ones first (a spot VM borrowing one runs on as any spot VM); 409 when its
    VMs use more."""
    rows = list(Device.objects.filter(lease=lease).values_list("pk", "vm_id", "vm__lease_id"))
    used = sum(vm is not None and vm_lease == lease.pk for _pk, vm, vm_lease in rows)
    if used > gpus:
        raise Conflict(
            f"lease {lease.name}: its VMs use {used} of its GPUs, more than {gpus}: delete, "
            "stop or shelve some first",
            code="in_use",
            details={"gpus": [f"its VMs use {used}"]},
        )
    spare = sorted((vm is not None, pk) for pk, vm, vm_lease in rows if vm_lease != lease.pk)
    going = [pk for _borrowed, pk in spare[: max(0, len(rows) - gpus)]]
    if going:
        _release(lease, going, now)


def _release(lease: Lease, going: list[int], now: datetime) -> None:
    """Let go of ``lease``'s GPUs ``going`` from ``now``: their allocations not begun are
    dropped, the others end now."""
    from compute.services import spot

    Device.objects.filter(pk__in=going).update(lease=None)
    LeaseAllocation.objects.filter(lease=lease, device__in=going, starts_at__gte=now).delete()
    LeaseAllocation.objects.filter(lease=lease, device__in=going).update(ends_at=now)
    transaction.on_commit(placement.view.invalidate, robust=True)
    transaction.on_commit(spot.index.invalidate, robust=True)  # borrowers are spot again


def _latest_fit(asked: _Asked, start: datetime, end: datetime) -> datetime:
    """The latest end before ``end`` of a period from ``start`` that ``asked`` fits;
    ``start`` when none does. What a period holds changes only where another lease starts
    inside it, and a longer period holds all a shorter one does: the ends to try are those
    starts, in order, up to the first that does not fit."""
    latest = start
    for bound in sorted({s for s, _e, _n in guarantees.lease_intervals(asked.model, start, end)}):
        if bound <= start:
            continue
        if not asked.fits(start, bound):
            break
        latest = bound
    return latest


def _notice_borrowers(lease: Lease) -> int:
    """The eviction notice of each spot VM on ``lease``'s GPUs (its row locked), in the
    order of every writer of a host's VMs: the hosts, then the VMs. The borrowers may be
    other projects': their trails name the scheduler, not this lease's admin."""
    rows = Device.objects.filter(lease=lease, vm__priority=Priority.SPOT)
    pairs = set(rows.values_list("host_id", "vm_id").order_by())
    _lock_hosts(host_id for host_id, _ in pairs)
    with audit.acting_as("scheduler"):
        return _notify_spot(
            {vm_id for _, vm_id in pairs},
            timezone.now(),
            why=f"its lease {lease.name} no longer lends its GPUs",
        )


# --- the tick: prepare, start, warn, end -------------------------------------------------------


def leases_tick(*, now: datetime | None = None) -> dict:
    """Beat's pass (and the replay's): each lease that is due moves on one step, each in
    its own transaction. Returns how many leases did what."""
    now = now or timezone.now()
    done = {"prepared": 0, "started": 0, "warned": 0, "ended": 0, "healed": 0}
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
    for pk in _to_heal(live, now).values_list("pk", flat=True):
        done["healed"] += _step(pk, lambda lease: _heal(lease, now))
    return done


def _step(pk, action) -> int:
    """Run ``action`` on lease ``pk`` (its row locked, skipped while another holds it) in its
    own transaction: 1 if it did, 0 if not (an action may answer whether it changed
    anything)."""
    with transaction.atomic():
        lease = (
            Lease.objects.select_for_update(skip_locked=True)
            .select_related("project")
            .filter(pk=pk, state__in=HOLDING)
            .first()
        )
        if lease is None:
            return 0
        changed = action(lease)
        return 1 if changed is None else int(changed)


def _prepare(lease: Lease, now: datetime) -> None:
    """Take hold of real GPUs for ``lease`` and give the spot VMs on them their notice."""
    guarantees._advisory_lock(f"kumo.guarantee.gpu.{lease.gpu_model}")
    held = _hold(lease, _choose_devices(lease, lease.gpus, lease.starts_at), lease.starts_at)
    if held is None:
        return  # the next tick chooses again
    # Their notices end before the lease starts (``KUMO_LEASE_LEAD_S``).
    why = f"its GPUs are reserved from {lease.starts_at:%H:%M:%S}"
    noticed = _notify_spot([d.vm_id for d in held if d.vm_id is not None], now, why=why)
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


def _hold(lease: Lease, chosen: list[tuple[int, int]], start: datetime) -> list[Device] | None:
    """Take hold of the GPUs ``chosen`` (device, host) for ``lease`` over ``[start, its
    end)``: those still free or used by spot VMs, their hosts locked first. Returns the
    devices held (their spot VMs are the caller's to notice); None when another lease took
    one of them over an overlapping period meanwhile (the database's constraint said so),
    and then nothing is held."""
    _lock_hosts(host_id for _, host_id in chosen)
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
                LeaseAllocation(lease=lease, device=d, starts_at=start, ends_at=lease.ends_at)
                for d in held
            )
    except IntegrityError:
        log.warning("lease %s: a chosen GPU was taken meanwhile", lease.pk)
        return None
    Device.objects.filter(pk__in=[d.pk for d in held]).update(lease=lease)
    transaction.on_commit(placement.view.invalidate, robust=True)  # its GPUs are no one's
    return held


def _choose_devices(lease: Lease, count: int, start: datetime) -> list[tuple[int, int]]:
    """(device, host) pairs of ``count`` GPUs for ``lease`` over ``[start, its end)``: GPUs
    of its model on hosts that are up, held by no lease then and by no VM but a spot one;
    whole hosts first (its VMs need whole cells), free GPUs before those spot VMs use. A
    lease that holds GPUs already (it grows) takes first the GPUs beside them: on the cells,
    then the hosts, it holds, so that its VMs find whole cells in it. A lease of whole hosts
    takes only hosts all of whose GPUs are such, every GPU of each."""
    beside = set(Device.objects.filter(lease=lease).values_list("host_id", "numa_node"))
    beside_hosts = {host_id for host_id, _cell in beside}
    overlapping = LeaseAllocation.objects.filter(
        starts_at__lt=lease.ends_at, ends_at__gt=start
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
        key=lambda devices: (
            devices[0][1] not in beside_hosts,
            -len(devices),
            sum(d[2] is not None for d in devices),
            devices[0][1],
        ),
    )
    if lease.hosts is not None:
        per_host = lease.gpus // lease.hosts
        hosts = [devices for devices in hosts if len(devices) == per_host][: lease.hosts]
    chosen = []
    for devices in hosts:
        for pk, host_id, _vm, _cell, _pci in sorted(
            devices, key=lambda d: ((d[1], d[3]) not in beside, d[2] is not None, d[3] or 0, d[4])
        ):
            if len(chosen) == count:
                return chosen
            chosen.append((pk, host_id))
    return chosen


def _lock_hosts(host_ids) -> None:
    """Lock hosts ``host_ids`` in key order: every writer of a host's devices and VMs locks
    the hosts first, then the devices or VMs."""
    for host_id in sorted(set(host_ids)):
        Host.objects.select_for_update(no_key=True).filter(pk=host_id).exists()


def _notify_spot(vm_ids, now: datetime, *, why: str) -> int:
    """The eviction notice of each spot VM of ``vm_ids`` (one that has one already keeps
    it), saying ``why``."""
    from compute.services import spot

    noticed = 0
    for pk in sorted(set(vm_ids)):
        vm = (
            VirtualMachine.objects.select_for_update(of=("self",))
            .select_related("project", "template", "host")
            .filter(pk=pk, priority=Priority.SPOT, state__in=spot.EVICTABLE, task_state=VmTask.NONE)
            .first()
        )
        if vm is not None:
            spot.notify(vm, None, now, why=why)
            noticed += 1
    return noticed


def _start(lease: Lease, now: datetime) -> None:
    lease.state = LeaseState.ACTIVE
    lease.save(update_fields=["state"])
    if lease.lend_idle:  # the scheduler's view reads whether some lease lends
        transaction.on_commit(placement.view.invalidate, robust=True)
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


# A lease's GPU in service: on a host that is up, and present (of a lease of whole hosts,
# whose hosts are what it holds, on a host that is up).
_IN_SERVICE = Q(devices__host__state=HostState.UP) & (
    Q(devices__present=True) | Q(hosts__isnull=False)
)


def _to_heal(live, now: datetime):
    """The leases holding GPUs that hold fewer than their size in service, or hold some
    out of service."""
    return (
        live.filter(state__in=(LeaseState.PREPARING, LeaseState.ACTIVE), ends_at__gt=now)
        .annotate(in_service=Count("devices", filter=_IN_SERVICE), held=Count("devices"))
        .filter(Q(in_service__lt=F("gpus")) | Q(held__gt=F("in_service")))
        .order_by()
    )


def _heal(lease: Lease, now: datetime) -> bool:
    """Hold ``lease``'s size (its row locked) in GPUs in service: take hold of the ones
    missing, then let go of as many out of service as were found (never one its own VMs
    use; of a lease of whole hosts, only whole hosts). Says when it holds too few. Returns
    whether it held or let go of any."""
    rows = list(
        Device.objects.filter(lease=lease)
        .values_list("pk", "host_id", "host__name", "host__state", "present", "vm__lease_id")
        .order_by("host_id", "pk")
    )
    whole_hosts = lease.hosts is not None
    out = [row for row in rows if not (row[3] == HostState.UP and (row[4] or whole_hosts))]
    in_service = len(rows) - len(out)
    used = {host_id for _, host_id, _, _, _, vm_lease in out if vm_lease == lease.pk}
    spare = [
        (pk, name)
        for pk, host_id, name, _, _, vm_lease in out
        if vm_lease != lease.pk and not (whole_hosts and host_id in used)
    ]
    start = max(lease.starts_at, now)
    held: list[Device] = []
    if in_service < lease.gpus:
        guarantees._advisory_lock(f"kumo.guarantee.gpu.{lease.gpu_model}")
        chosen = _choose_devices(lease, lease.gpus - in_service, start)
        held = _hold(lease, chosen, start) if chosen else []
        if held is None:
            return False  # another lease took one meanwhile: the next tick chooses again
    going = spare if in_service + len(held) >= lease.gpus else spare[: len(held)]
    if going:
        _release(lease, [pk for pk, _ in going], now)
    noticed = 0
    if held:
        why = f"its GPUs are reserved by a lease from {start:%H:%M:%S}"
        noticed = _notify_spot([d.vm_id for d in held if d.vm_id is not None], now, why=why)
    holding = in_service + len(held)
    before, lease.state_reason = (
        lease.state_reason,
        f"holding {holding} of {lease.gpus} GPUs" if holding < lease.gpus else "",
    )
    if lease.state_reason != before:
        lease.save(update_fields=["state_reason"])
    if held or going:
        left = sorted({name for _, name in going})
        audit.record(
            "lease.heal",
            lease,
            project=lease.project,
            detail={"held": len(held), "let_go": len(going), "hosts_left": left,
                    "spot_noticed": noticed},
        )  # fmt: skip
        done = [f"took hold of {len(held)} GPUs on hosts in service"] if held else []
        if going:
            done.append(
                f"let go of {len(going)} GPUs on hosts that left service ({', '.join(left)})"
            )
        _announce(
            lease,
            f"lease {lease.name} {' and '.join(done)}",
            held=len(held),
            let_go=len(going),
            hosts_left=left,
        )
    if holding < lease.gpus and lease.state_reason != before:
        _at_risk(lease, holding)
    return bool(held or going)


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
        from compute.services import spot

        transaction.on_commit(placement.view.invalidate, robust=True)
        transaction.on_commit(spot.index.invalidate, robust=True)  # borrowers are spot again
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
    if lease.hosts is None:
        message = (
            f"lease {lease.name} holds {held} of its {lease.gpus} {lease.gpu_model} GPUs: "
            "hosts left service since it was admitted"
        )
    else:
        message = (
            f"lease {lease.name} holds {held} of its {lease.gpus} {lease.gpu_model} GPUs "
            f"({lease.hosts} whole hosts): hosts left service, or on-demand VMs took GPUs on "
            "the hosts it needed, since it was admitted"
        )
    audit.record(
        "lease.at_risk",
        lease,
        project=lease.project,
        detail={"held": held, "gpus": lease.gpus},
    )
    events.emit("lease.at_risk", project=lease.project, obj=lease, message=message, mail=True)
    log.warning(message)
