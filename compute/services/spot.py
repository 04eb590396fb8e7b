"""Spot VMs: preemption for on-demand requests, eviction notices, the hand-over, restart.

The life of an eviction, each step a conditional update (``lifecycle.transition``: billing
and all that follows VM states see it) kept in the database for a restarted controller:

1. ``preempt_for(vm)``: an on-demand VM that placement could not fit asks
   ``compute.preemption`` for the best victims on one host (a VM in a lease: among the
   spot VMs borrowing its lease's idle GPUs, ``compute.placement._place_borrowing``).
   Each victim moves to ``evicting`` with ``eviction_deadline`` = now + its template's
   ``eviction_notice_s``, or later: the decision's deadline (``Preemption.deadline``: a
   notice made up to ``KUMO_SPOT_NOTICE_STRETCH_S`` longer for a guest expected to save
   just after it, and every running victim stopped with the last) (an event
   ``vm.eviction_notice`` tells its project, webhooks and the guest's metadata endpoint,
   with its deadline); the on-demand VM stays ``pending`` with
   ``reserved_host`` set, which keeps the periodic placement from placing it elsewhere
   meanwhile.
2. While the notice runs the guest keeps running. When the deadline passes
   (``evictions_reap``, run by beat) or the guest acknowledges early
   (``eviction_acknowledge``), the victim's task becomes ``stopping`` and its host is told to
   stop it (forced off after ``KUMO_SPOT_STOP_GRACE_S``).
3. ``evictions_hand_over``: when the host reports a victim shut off at its current
   generation (its ``vm_apply`` answer, or its periodic guests report) and every victim of
   the same hand-over is shut off too, one transaction releases their capacity and GPUs,
   moves them to ``evicted`` and claims the freed room for the waiting VM on that host. A
   victim holds its GPUs until its host reported its guest stopped, and the waiting VM gets
   them in the same transaction: a GPU never has two owners, and nothing else can take the
   room in between. Until then a report only records the guest's power: an evicting VM
   stays evicting whatever its guest does.
4. An evicted VM holds nothing (no host, no GPUs, no quota). ``vm_start_evicted`` claims
   its quota again and makes it pending; it is placed when capacity returns.

Locks: the host row first, then its VMs by primary key, in every transaction that locks
more than one VM of a host (the guests report, a ``vm_apply`` report, ``preempt_for``).

Guaranteed minimums (mdx's Rmin, ``CapacityGuarantee.min_gpus``): a project's GPU VMs count
towards its minimum on-demand first, then spot oldest first, and its spot VMs within the
minimum are never victims (no on-demand VM ever is): its use up to its minimum is never
preempted, and its on-demand requests evict other projects' unprotected spot VMs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, FloatField, Func, OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from compute import leases, placement
from compute.choices import DesiredPower, PowerState, Priority, VmState, VmTask
from compute.models import CapacityGuarantee, Device, Host, VirtualMachine
from compute.preemption import NOTHING_TO_LOSE, Candidate, Preemption, choose_victims
from compute.protocol import VM_APPLY_TASK, VmApply
from compute.scheduler import NoValidHost
from compute.services.lifecycle import (
    current_operation,
    kept_disk_path,
    requeue,
    send_apply,
    transition,
)
from controlplane import agents, audit, events
from controlplane.compiled import Compiled, CompiledUpdate
from controlplane.errors import Conflict, NotFound
from controlplane.models import Operation

log = logging.getLogger(__name__)

# The states of a spot VM that can be evicted (no action in flight).
EVICTABLE = [VmState.RUNNING, VmState.STOPPED]
# States whose GPUs count towards a project's guaranteed minimum.
GPU_HOLDING = [VmState.PROVISIONING, VmState.RUNNING, VmState.STOPPED, VmState.ERROR]


# --- guaranteed minimums --------------------------------------------------------------------


def protected_spot_vms() -> set:
    """Ids of the spot VMs guaranteed minimums protect: per project with a minimum, its
    GPU VMs counted on-demand first, then spot oldest first, while they stay within it.
    Reads a project's spot VMs only while its minimum has room left, a page at a time."""
    holding = VirtualMachine.objects.filter(gpus__gt=0, state__in=GPU_HOLDING)
    on_demand = (
        holding.filter(project_id=OuterRef("project_id"), priority=Priority.ON_DEMAND)
        .order_by()
        .values("project_id")
        .annotate(gpus=Sum("gpus"))
        .values("gpus")
    )
    minimums = {
        project_id: minimum - used
        for project_id, minimum, used in CapacityGuarantee.objects.filter(min_gpus__gt=0)
        .annotate(used=Coalesce(Subquery(on_demand), 0))
        .values_list("project_id", "min_gpus", "used")
    }
    protected = set()
    for project_id, left in minimums.items():
        spot = (
            holding.filter(project_id=project_id, priority=Priority.SPOT, gpus__lte=left)
            .order_by("created_at", "pk")
            .values_list("pk", "gpus")
        )
        offset = 0
        while left > 0:
            page = list(spot[offset : offset + 100])
            for pk, gpus in page:
                if gpus <= left:
                    left -= gpus
                    protected.add(pk)
            if len(page) < 100:
                break
            offset += 100
    return protected


def guarantee_set(*, project, min_gpus: int, **more) -> CapacityGuarantee:
    """Set ``project``'s guaranteed minimum (operators); see ``compute.guarantees``."""
    from compute import guarantees

    return guarantees.guarantee_set(project=project, min_gpus=min_gpus, **more)


# --- deciding -------------------------------------------------------------------------------


class _Epoch(Func):
    """A timestamp as seconds since 1970, a float (cheaper to load than a datetime)."""

    output_field = FloatField()

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(
            compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::float8"
        )

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(
            compiler, connection, template="(julianday(%(expressions)s) - 2440587.5) * 86400.0"
        )


# Since when a spot VM's work is unsaved, as Kumo knows it: its last start or the last
# checkpoint its guest reported, whichever came later (its creation before either). An
# eviction loses the work done since: preemption weighs it (``compute.preemption``, its
# ``started``).
UNSAVED_SINCE = Greatest(
    Coalesce("running_since", "created_at"), Coalesce("checkpointed_at", "created_at")
)


def _candidate(
    vm_id: str,
    host_id: int,
    gpus: int,
    vcpus: int,
    memory_mib: int,
    cell,
    state: str,
    started: float,
    interval: float | None,
    notice_s: int,
    rdma_vfs: int = 0,
) -> Candidate:
    """A spot VM as preemption weighs it (its row's values; ``started``: ``UNSAVED_SINCE``
    in seconds since 1970). A stopped one has nothing to lose. A guest that reported a save
    is expected to save again one reported ``interval`` after its last save or start."""
    if state == VmState.STOPPED:
        started = NOTHING_TO_LOSE
    saves_at = started + interval if interval and started < NOTHING_TO_LOSE else None
    return Candidate(
        vm_id,
        host_id,
        gpus,
        vcpus,
        memory_mib,
        started,
        cell,
        saves_at=saves_at,
        notice_s=notice_s,
        rdma_vfs=rdma_vfs,
    )


# How far before the last read each update of the index reads changed spot VMs again: a
# transaction that stamped ``updated_at`` before that read but committed after it is seen.
SYNC_SLACK = timedelta(seconds=2)
# How many times ``preempt_for`` decides again after a victim turned out to have changed.
DECIDE_ATTEMPTS = 3


class _EvictableIndex:
    """This process's evictable spot VMs (running or stopped, no action in flight, on a
    host) by host, as the decision reads them, so that a decision reads no more than what
    changed: loaded whole every ``KUMO_SCHEDULER_VIEW_TTL_S``, and brought up to date
    before each decision with the spot VMs whose ``updated_at`` is at most ``SYNC_SLACK``
    before the last read. It may still be stale (a deleted row, a very late commit): a
    victim that is no longer evictable fails the locked re-check in ``preempt_for``, which
    reads its host again here and decides again.

    A spot VM on GPUs a lease lends (``compute.placement._place_borrowing``) is not here:
    only a VM of that lease can use what its eviction frees (``_decide_in_lease``)."""

    _COLUMNS = (
        "pk",
        "host_id",
        "numa_cell",
        "gpus",
        "gpu_model",
        "vcpus",
        "memory_mib",
        "state",
        "task_state",
        "checkpoint_interval_s",
        "template__eviction_notice_s",
        "rdma_vfs",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.invalidate()

    def invalidate(self) -> None:
        """Forget everything: the next decision reads every evictable spot VM again."""
        self.hosts: dict[int, dict[str, Candidate]] = {}
        self.where: dict[str, int] = {}  # vm id -> host id
        self.model: dict[str, str] = {}  # vm id -> GPU model
        # Per host, its candidates as a tuple and their GPU models, rebuilt when it changed.
        self.lists: dict[int, tuple[tuple[Candidate, ...], frozenset]] = {}
        self.read_at: datetime | None = None
        self.loaded_at = 0.0

    def _read(self, qs) -> None:
        borrowing = Exists(Device.objects.filter(vm_id=OuterRef("pk"), lease__isnull=False))
        rows = qs.values_list(*self._COLUMNS, _Epoch(UNSAVED_SINCE), borrowing).order_by()
        for (
            pk,
            host_id,
            cell,
            gpus,
            model,
            vcpus,
            memory,
            state,
            task,
            interval,
            notice,
            vfs,
            started,
            lent,
        ) in rows:
            vm_id = str(pk)
            before = self.where.pop(vm_id, None)
            if before is not None:
                self.hosts[before].pop(vm_id, None)
                self.lists.pop(before, None)
            self.model.pop(vm_id, None)
            if state in EVICTABLE and not task and host_id is not None and not lent:
                cell = cell if gpus else None
                cand = _candidate(
                    vm_id, host_id, gpus, vcpus, memory, cell, state, started, interval, notice, vfs
                )
                self.hosts.setdefault(host_id, {})[vm_id] = cand
                self.where[vm_id] = host_id
                self.lists.pop(host_id, None)
                if gpus:
                    self.model[vm_id] = model

    def sync(self) -> None:
        """Read what changed since the last read (or everything, when the TTL is over)."""
        now = timezone.now()
        spot = VirtualMachine.objects.filter(priority=Priority.SPOT)
        expired = placement.view_clock() - self.loaded_at > settings.SCHEDULER_VIEW_TTL_S
        if self.read_at is None or expired:
            self.invalidate()
            self.loaded_at = placement.view_clock()
            self._read(spot.filter(state__in=EVICTABLE, task_state=VmTask.NONE, host__isnull=False))
        else:
            self._read(spot.filter(updated_at__gte=self.read_at - SYNC_SLACK))
        self.read_at = now

    def refresh_host(self, host_id: int) -> None:
        """Read ``host_id``'s evictable spot VMs again, whole."""
        for vm_id in self.hosts.pop(host_id, {}):
            self.where.pop(vm_id, None)
            self.model.pop(vm_id, None)
        self.lists.pop(host_id, None)
        self._read(
            VirtualMachine.objects.filter(
                priority=Priority.SPOT,
                host_id=host_id,
                state__in=EVICTABLE,
                task_state=VmTask.NONE,
            )
        )

    def _lists(self) -> dict[int, tuple[tuple[Candidate, ...], frozenset]]:
        for host_id, vms in self.hosts.items():
            if host_id not in self.lists:
                # In one order whatever order the database read them in: of two sets equal
                # by every measure, the search keeps the first it meets.
                cands = tuple(sorted(vms.values(), key=lambda c: (c.started, c.vm_id)))
                models = frozenset(self.model[c.vm_id] for c in cands if c.gpus)
                self.lists[host_id] = (cands, models)
        return self.lists

    def candidates(self, req, protected: set, hosts) -> dict[int, Sequence[Candidate]]:
        """The candidates for ``req`` on ``hosts`` (the scheduler's views of the hosts that
        are up, by id): for a GPU request those holding GPUs of its model and the CPU-only
        ones beside them, for a CPU request the CPU-only; never a ``protected`` one. Only
        the hosts holding a protected VM or GPUs of several models are filtered one by one.
        A host where even evicting all of them would not free the RDMA virtual functions
        the request needs has none (the victims chosen must free enough of them:
        ``compute.preemption``)."""
        touched = {self.where[vm_id] for vm_id in protected if vm_id in self.where}
        found: dict[int, Sequence[Candidate]] = {}
        for host_id, (cands, models) in self._lists().items():
            view = hosts.get(host_id)
            if view is None or not cands:
                continue
            if req.rdma_vfs > view.vfs_free + sum(c.rdma_vfs for c in cands):
                continue
            if not req.gpus:
                cands = [c for c in cands if not c.gpus]
            elif req.gpu_model:
                if view.gpu_model != req.gpu_model:
                    continue  # no GPU of that model there: the request cannot fit
                if models - {req.gpu_model}:
                    cands = [c for c in cands if not c.gpus or self.model[c.vm_id] == req.gpu_model]
            if host_id in touched:
                cands = [c for c in cands if c.vm_id not in protected]
            if cands:
                found[host_id] = cands
        return found


index = _EvictableIndex()


def decide(vm: VirtualMachine, *, pinned_only: bool = False) -> Preemption | None:
    """The preemption that would make room for ``vm`` now (no writes), over the scheduler's
    view and this process's index of evictable spot VMs, brought up to date first; for a
    VM in a lease, over the spot VMs borrowing its lease's GPUs (``_decide_in_lease``).
    ``pinned_only``: on hosts where on-demand work or a lease holds a GPU
    (``HostView.pinned``) only."""
    req = placement.request_for(vm)
    if vm.lease_id is not None:
        return _decide_in_lease(vm, req)
    protected = {str(pk) for pk in protected_spot_vms()}
    with index.lock:
        index.sync()
        with placement.view.lock:
            known = placement.view.get().hosts
            candidates = index.candidates(req, protected, known)
            if pinned_only:
                candidates = {h: c for h, c in candidates.items() if known[h].pinned}
            return _choose((known[h] for h in candidates), candidates, req)


def _decide_leaving_hosts_whole(vm: VirtualMachine) -> Preemption | None:
    """``decide``, on a host the on-demand ``vm`` may take while leases of whole hosts need
    theirs (``compute.guarantees.whole_hosts_refusal``): where the best host would be
    one no on-demand work holds and that the leases need, the best of the hosts on-demand
    work or a lease already holds; None when none makes room."""
    from compute.guarantees import whole_hosts_refusal

    decision = decide(vm)
    if decision is None or not whole_hosts_refusal(vm, decision.host_id):
        return decision
    decision = decide(vm, pinned_only=True)
    if decision is None or whole_hosts_refusal(vm, decision.host_id):
        return None
    return decision


def _decide_in_lease(vm: VirtualMachine, req) -> Preemption | None:
    """The spot VMs borrowing the GPUs of ``vm``'s lease (active and lending,
    ``Lease.lend_idle``) whose eviction makes room for ``vm`` on them, from the database (a
    lease holds few hosts). Each borrower counts only the lease's GPUs it holds: what its
    eviction gives the lease back. A guaranteed minimum does not protect a borrower: the
    GPUs are the lease's, lent until its VMs need them."""
    if leases.placement_refusal(vm):
        return None
    # One query: each borrower with the number of the lease's GPUs it holds (the count is
    # over the join the filter made, so of those GPUs only).
    rows = (
        VirtualMachine.objects.filter(
            priority=Priority.SPOT,
            state__in=EVICTABLE,
            task_state=VmTask.NONE,
            devices__lease_id=vm.lease_id,
        )
        .values_list(
            "pk",
            "host_id",
            "numa_cell",
            "vcpus",
            "memory_mib",
            "state",
            "checkpoint_interval_s",
            "template__eviction_notice_s",
            "rdma_vfs",
        )
        .annotate(lent=Count("devices"), started=_Epoch(UNSAVED_SINCE))
        .order_by()
    )
    candidates: dict[int, list[Candidate]] = {}
    for pk, host_id, cell, vcpus, memory, state, interval, notice, vfs, lent, started in rows:
        cand = _candidate(
            str(pk), host_id, lent, vcpus, memory, cell, state, started, interval, notice, vfs
        )
        candidates.setdefault(host_id, []).append(cand)
    if not candidates:
        return None
    for cands in candidates.values():
        cands.sort(key=lambda c: (c.started, c.vm_id))  # the index's order (``_lists``)
    hosts = placement.lease_views(vm.lease_id)
    return _choose(hosts, candidates, req)


def _choose(hosts, candidates, req) -> Preemption | None:
    """``compute.preemption.choose_victims`` now, each evicted GPU costing
    ``KUMO_SPOT_EVICTION_COST_S`` beyond the work it loses."""
    return choose_victims(
        hosts,
        candidates,
        req,
        now=timezone.now().timestamp(),
        cost_s=settings.SPOT_EVICTION_COST_S,
        stretch_s=settings.SPOT_NOTICE_STRETCH_S,
    )


# --- notices --------------------------------------------------------------------------------


def preempt_for(vm: VirtualMachine, *, admitted: bool = False) -> Preemption | None:
    """Give eviction notices to the spot VMs whose removal makes room for the on-demand
    ``vm`` (pending, placement having found nothing), in the caller's transaction; returns
    the decision, or ``None`` when no eviction helps. A victim that changed meanwhile (the
    index was stale) makes it read that host again and decide again, ``DECIDE_ATTEMPTS``
    times in all; then the periodic placement tries again.

    ``admitted``: the caller's placement weighed ``vm``'s admission in this transaction
    and admitted it (``NoValidHost.admitted``); the locks that weighing took are held to
    its end, so it is not weighed again."""
    if vm.priority != Priority.ON_DEMAND or vm.state != VmState.PENDING or vm.reserved_host_id:
        return None
    from compute import guarantees

    # (never refused for a VM in a lease: its GPUs are its own)
    if not admitted and guarantees.admission_refusal(vm):
        return None  # it may not take the capacity it would free: it waits
    for _attempt in range(DECIDE_ATTEMPTS):
        decision = _decide_leaving_hosts_whole(vm)
        if decision is None:
            return None
        now = timezone.now()
        try:
            with transaction.atomic():
                victims = _lock_victims(decision)
                # The victims' trails name the scheduler, never this request's user,
                # address or VM (the victims may be other projects').
                with audit.acting_as("scheduler"):
                    until = datetime.fromtimestamp(decision.deadline, UTC)
                    deadlines = [notify(victim, vm, now, until=until) for victim in victims]
            break
        except Conflict as e:
            log.info("vm %s: preemption on %s abandoned: %s", vm.pk, decision.host_name, e)
            with index.lock:
                index.refresh_host(decision.host_id)
            with placement.view.lock:
                placement.view.refresh_host(decision.host_id)
    else:
        return None
    deadline = max(deadlines)
    reason = (
        f"waiting for {len(victims)} spot VM(s) on {decision.host_name} to be evicted "
        f"(notice ends {deadline.isoformat()})"
    )
    VirtualMachine.objects.filter(pk=vm.pk).update(
        reserved_host_id=decision.host_id, state_reason=reason, updated_at=now
    )
    vm.reserved_host_id, vm.state_reason = decision.host_id, reason
    with placement.view.lock:  # the host is being handed over: no other request takes it
        placement.view.refresh_host(decision.host_id)
    audit.record(
        "vm.preempt",
        vm,
        project=vm.project,
        detail={
            "host": decision.host_name,
            "victims": len(victims),
            # only this project's own victims are named in its trail
            "own_victims": [str(v.pk) for v in victims if v.project_id == vm.project_id],
            "deadline": deadline.isoformat(),
        },
    )
    # The victims may be other projects': this project learns how many, not which.
    events.emit(
        "vm.preempting",
        project=vm.project,
        message=f"vm {vm.name}: {reason}",
        obj=vm,
        payload={
            "host": decision.host_name,
            "victims": len(victims),
            "deadline": deadline.isoformat(),
        },
    )
    log.info("vm %s: evicting %s on %s", vm.pk, list(decision.victims), decision.host_name)
    return decision


def _lock_victims(decision: Preemption) -> list[VirtualMachine]:
    """The victims' rows, locked, if each is still an evictable spot VM on the host;
    raises ``Conflict`` otherwise. The host's row first, then the VMs by primary key: the
    order of every writer of a host's VMs (``evictions_hand_over``)."""
    Host.objects.select_for_update(no_key=True).filter(pk=decision.host_id).exists()
    victims = list(
        VirtualMachine.objects.select_for_update(of=("self",))
        .select_related("project", "template", "host")
        .filter(
            pk__in=decision.victims,
            host_id=decision.host_id,
            priority=Priority.SPOT,
            state__in=EVICTABLE,
            task_state=VmTask.NONE,
        )
        .order_by("pk")
    )
    if len(victims) != len(decision.victims):
        raise Conflict("a victim changed while the preemption was decided")
    return victims


def notify(
    victim: VirtualMachine,
    waiter: VirtualMachine | None,
    now: datetime,
    *,
    why: str = "to make room for an on-demand VM",
    until: datetime | None = None,
) -> datetime:
    """One victim's notice: evicting, with its deadline (a stopped one has no notice): its
    template's notice, or ``until`` when that is later (the preemption waits for a save,
    or for another victim's). ``waiter``: the on-demand VM the room is for (None: a
    lease's GPUs)."""
    running = victim.state == VmState.RUNNING
    deadline = now + timedelta(seconds=victim.template.eviction_notice_s if running else 0)
    if running and until is not None:
        deadline = max(deadline, until)
    transition(
        victim,
        state=VmState.EVICTING,
        task_state=VmTask.NONE if running else VmTask.STOPPING,
        eviction_notice_at=now,
        eviction_deadline=deadline,
        eviction_acknowledged_at=None,
        evicted_for=waiter,
        state_reason=f"spot capacity reclaimed {why}; stops at {deadline:%H:%M:%S}",
    )
    detail = {"deadline": deadline.isoformat(), "host": victim.host.name}
    audit.record("vm.eviction_notice", victim, project=victim.project, detail=detail)
    events.emit(
        "vm.eviction_notice",
        project=victim.project,
        message=f"spot vm {victim.name} will be stopped at {deadline.isoformat()} {why}",
        obj=victim,
        payload={"action": "stop", "time": deadline.isoformat(), "vm": str(victim.pk)},
    )
    if not running:
        send_apply(victim, operation_id=current_operation(victim))
    return deadline


def _stop_now(vm: VirtualMachine, *, why: str) -> None:
    """The notice is over: ask the host to stop the guest."""
    transition(vm, task_state=VmTask.STOPPING)
    audit.record("vm.eviction_stop", vm, project=vm.project, detail={"why": why})
    send_apply(vm, operation_id=current_operation(vm))


@transaction.atomic
def eviction_acknowledge(*, vm: VirtualMachine) -> VirtualMachine:
    """The guest says it is ready ("checkpoint done, take it now"): the notice ends at once.
    Repeating it changes nothing; a VM with no notice answers ``NotFound``."""
    vm = (
        VirtualMachine.objects.select_for_update(of=("self",))
        .select_related("project", "host", "image")
        .get(pk=vm.pk)
    )
    if vm.state != VmState.EVICTING:
        raise NotFound("no eviction notice for this VM")
    if vm.task_state == VmTask.NONE:
        now = timezone.now()
        transition(
            vm,
            eviction_acknowledged_at=now,
            eviction_deadline=min(vm.eviction_deadline or now, now),
        )
        _stop_now(vm, why="acknowledged by the guest")
    return vm


def checkpoint_report(*, vm: VirtualMachine) -> VirtualMachine:
    """The guest saved its work (``POST /api/v1/metadata/spot/checkpoint``): an eviction
    would lose only what it does from now on, so preemption, of equally few victims, takes
    this VM before those whose work is unsaved for longer (``UNSAVED_SINCE``). Reporting is
    the guest's choice; claiming a checkpoint it did not make only gets it evicted first.

    Only a running guest's report counts (409 otherwise); no host is told anything. Like a
    CPU sample it is an observation of the guest, kept on the VM (``checkpointed_at``, and
    the interval since its save before or its start, ``checkpoint_interval_s``: when it
    will likely save next), not an action anyone took: it has no audit record."""
    now = timezone.now()
    if not _CHECKPOINT.run(vm.pk, now, now.timestamp()):
        state = VirtualMachine.objects.filter(pk=vm.pk).values_list("state", flat=True).first()
        raise Conflict(
            f"vm {vm.name} is {state or VmState.DELETED}: only a running guest's checkpoint counts",
            code="invalid_state",
            details={"state": [state or VmState.DELETED]},
        )
    vm.checkpointed_at = vm.updated_at = now
    return vm


_SAVES = [VmState.RUNNING, VmState.EVICTING]  # a guest that can report a checkpoint

# The SET reads the row as it was: the interval is from the save before (or the start).
# Compiled once: a fleet's spot guests report a save every half hour each.
_CHECKPOINT = CompiledUpdate(
    lambda pk, now, epoch: (
        VirtualMachine.objects.filter(pk=pk, state__in=_SAVES),
        {
            "checkpointed_at": now,
            "checkpoint_interval_s": Value(epoch) - _Epoch(UNSAVED_SINCE),
            "updated_at": now,
        },
    ),
    UUID,
    datetime,
    float,
)


def evictions_reap(*, now: datetime | None = None) -> int:
    """Beat's pass: every victim whose notice has ended is stopped; a waiting VM whose
    victims are all gone (deleted, or the hand-over failed) goes back to plain pending.
    Returns how many victims were told to stop. All of it is read from the database, so
    a controller restarted mid-notice carries on where it was."""
    now = now or timezone.now()
    count = 0
    for (pk,) in _NOTICE_ENDED.tuples(now):
        with transaction.atomic():
            found = _REAPED.objects(pk)
            if not found:
                continue
            _stop_now(found[0], why="notice ended")
            count += 1
    for (pk,) in _WAITING_FOR_NONE.tuples():
        VirtualMachine.objects.filter(pk=pk, state=VmState.PENDING).update(
            reserved_host=None, state_reason="the evictions for this VM ended; waiting for room"
        )
    return count


# The reaper's reads, compiled once: it runs at every notice's deadline. The victims whose
# notice has ended, in key order (their stops come in the same order whatever the plan);
# one of them locked (skipped when another transaction holds it) with what its stop needs;
# the VMs still reserving a host that no victim is being evicted for.
_NOTICE_ENDED = Compiled(
    lambda now: (
        VirtualMachine.objects.filter(
            state=VmState.EVICTING, task_state=VmTask.NONE, eviction_deadline__lte=now
        )
        .order_by("pk")
        .values_list("pk")
    ),
    datetime,
)
_REAPED = Compiled(
    lambda pk: (
        VirtualMachine.objects.select_for_update(of=("self",), skip_locked=True)
        .select_related("project", "host", "image")
        .filter(pk=pk, state=VmState.EVICTING, task_state=VmTask.NONE)[:1]
    ),
    UUID,
)
_WAITING_FOR_NONE = Compiled(
    lambda: (
        VirtualMachine.objects.filter(state=VmState.PENDING, reserved_host__isnull=False)
        .exclude(pk__in=VirtualMachine.objects.filter(state=VmState.EVICTING).values("evicted_for"))
        .order_by("pk")
        .values_list("pk")
    )
)


# --- the hand-over --------------------------------------------------------------------------


def evictions_hand_over(host: Host) -> list[str]:
    """Called with ``host``'s row locked (the guests report, a ``vm_apply`` report): every
    hand-over on it whose victims are all shut off at their generation happens now, in this
    transaction: the victims are evicted and the waiting VM placed in the room they free.
    Returns the ids of the VMs evicted.

    The lock order, the same as the guests report's: the host row, then its VMs by primary
    key. Every transaction that locks more than one VM of a host holds the host's row first
    (``preempt_for`` too), so none of them can wait for another in a cycle."""
    victims = _VICTIMS_LOCKED.objects(host.pk)
    hand_overs: dict = {}
    for victim in victims:
        # A victim whose waiter was deleted meanwhile is its own hand-over.
        hand_overs.setdefault(victim.evicted_for_id or victim.pk, []).append(victim)
    if not hand_overs:
        return []
    # A victim its project deleted during its notice holds its room until its guest is gone
    # (``victim_gone`` then calls this again): its waiter's hand-over waits for it.
    deleting = {waiter for (waiter,) in _WAITERS_OF_DELETING.tuples(host.pk)}
    evicted: list[str] = []
    for group in hand_overs.values():
        if not all(shut_off(v) for v in group) or group[0].evicted_for_id in deleting:
            continue
        waiter_id = group[0].evicted_for_id
        _evict(group, host)
        evicted.extend(str(v.pk) for v in group)
        if waiter_id is not None:
            _place_waiter(waiter_id, host.pk)
    return evicted


# The hand-over's reads, compiled once: it runs at every eviction. A host's victims, locked in
# key order; the waiters of its victims deleted during their notice; a waiter, locked.
_VICTIMS_LOCKED = Compiled(
    lambda host_id: (
        VirtualMachine.objects.select_for_update(of=("self",))
        .select_related("project", "template")
        .filter(host_id=host_id, state=VmState.EVICTING)
        .order_by("pk")
    ),
    int,
)
_WAITERS_OF_DELETING = Compiled(
    lambda host_id: VirtualMachine.objects.filter(
        host_id=host_id, state=VmState.DELETING, evicted_for__isnull=False
    ).values_list("evicted_for_id"),
    int,
)
_WAITER_LOCKED = Compiled(
    lambda pk, host_id: (
        VirtualMachine.objects.select_for_update(of=("self",))
        .select_related("project", "image", "placement_group")
        .filter(pk=pk, state=VmState.PENDING, reserved_host_id=host_id)[:1]
    ),
    UUID,
    int,
)


def victim_gone(vm: VirtualMachine, host: Host) -> None:
    """``vm``, a victim of a hand-over on ``host``, left it another way (its project
    deleted it during its notice) and its room is released. When no other victim of the
    same waiter is still being evicted, the waiter takes the room now, as the hand-over would
    have; otherwise the others' hand-over runs (it waited for this one, and they may all be
    off already). Called with the host's row locked (the lock order of
    ``evictions_hand_over``)."""
    waiter_id = vm.evicted_for_id
    if waiter_id is None:
        return
    others = VirtualMachine.objects.filter(evicted_for_id=waiter_id, state=VmState.EVICTING)
    if others.exclude(pk=vm.pk).exists():
        evictions_hand_over(host)
    else:
        _place_waiter(waiter_id, host.pk)


def _evict(victims: list[VirtualMachine], host: Host) -> None:
    """Release what ``victims`` hold on ``host`` and move them to evicted."""
    from compute.choices import EvictAction
    from network import services as network

    now = timezone.now()
    for victim in victims:
        placement.release(victim)
        network.ports_unbind(victim)
        shelving = victim.template.evict_action == EvictAction.SHELVE
        outcome = _shelve_evicted(victim, host, now) if shelving else {}
        transition(
            victim,
            **{"state": VmState.EVICTED, **outcome},
            task_state=VmTask.NONE,
            host=None,
            numa_cell=None,
            rack="",
            evicted_at=now,
            evicted_host=host,
            evicted_for=None,
            state_reason=f"evicted from {host.name} at {now.isoformat()}"
            + ("; shelved: unshelve it to run again" if shelving else ""),
        )
        audit.record("vm.evicted", victim, project=victim.project, detail={"host": host.name})
        events.emit(
            "vm.evicted",
            project=victim.project,
            message=f"spot vm {victim.name} was evicted; start it again when capacity returns",
            obj=victim,
            payload={"vm": str(victim.pk), "evicted_at": now.isoformat(), "host": host.name},
        )
        log.info("vm %s generation %d: evicted from %s", victim.pk, victim.generation, host.name)


def _shelve_evicted(vm: VirtualMachine, host: Host, now) -> dict:
    """The changes that make an evicted spot VM (its guest already shut off on ``host``,
    its claim released by the caller) shelved rather than evicted, and the task that keeps
    its disk on ``host`` after commit. For a template whose ``evict_action`` is shelve."""
    kept = kept_disk_path(vm)
    message = VmApply(
        vm_id=str(vm.pk), generation=vm.generation + 1, desired=DesiredPower.ABSENT,
        extra={"keep_root_disk": kept},
    )  # fmt: skip
    agents.send_to_host(host.name, VM_APPLY_TASK, **message.to_wire())
    return {"state": VmState.SHELVED, "kept_disk": kept, "shelved_at": now}


def shut_off(vm: VirtualMachine) -> bool:
    """Whether ``vm``'s host reported its guest shut off at its current generation."""
    return vm.power_state == PowerState.SHUTOFF and vm.applied_generation >= vm.generation


def _place_waiter(waiter_id, host_id: int) -> None:
    found = _WAITER_LOCKED.objects(waiter_id, host_id)
    if not found:
        return  # deleted meanwhile: the room is simply free
    waiter = found[0]
    try:
        with transaction.atomic():
            placement.place_on(waiter, host_id)
            from network import services as network

            network.ports_bind(waiter)
    except (NoValidHost, placement.ClaimConflict, Conflict) as e:
        # (A Conflict: its RDMA port found no free virtual function there.) The savepoint
        # undid the claim; the VM waits for room again.
        reason = f"the room freed on its host was not enough ({e}); waiting for room"
        VirtualMachine.objects.filter(pk=waiter.pk).update(
            reserved_host=None, state_reason=reason[:500]
        )
        log.warning("vm %s: hand-over on host %s failed: %s", waiter.pk, host_id, e)
        return
    VirtualMachine.objects.filter(pk=waiter.pk).update(reserved_host=None)
    waiter.reserved_host_id = None
    audit.record("vm.schedule", waiter, project=waiter.project, detail={"host": waiter.host.name})
    events.emit(
        "vm.placed",
        project=waiter.project,
        message=f"vm {waiter.name} placed on {waiter.host.name} after spot evictions",
        obj=waiter,
        payload={"host": waiter.host.name},
    )
    send_apply(waiter, operation_id=current_operation(waiter))


# --- restarting an evicted VM ---------------------------------------------------------------


@transaction.atomic
def vm_start_evicted(*, vm: VirtualMachine, actor=None) -> tuple[VirtualMachine, Operation]:
    """evicted → pending → placed when room is free. Its quota is claimed again (an evicted
    VM holds none), so a project that used it meanwhile gets 409."""
    operation, _placed = requeue(vm, action="start", kind="vm.start", actor=actor)
    audit.record(
        "vm.start",
        vm,
        project=vm.project,
        detail={"operation": str(operation.pk), "state": vm.state},
    )
    send_apply(vm, operation_id=str(operation.pk))
    return vm, operation
