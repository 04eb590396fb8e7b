"""Placement against the database: the scheduler's view, the atomic claim, the release.

The view (``compute.scheduler.Scheduler``) is loaded from the database and kept for
``KUMO_SCHEDULER_VIEW_TTL_S`` seconds in each process; it may be stale, so the claim
re-checks everything in the caller's transaction:

1. a member of a placement group locks the group's row and re-checks its policy against
   the members placed by then;
2. ``compute.claims`` writes the claim in one statement: it locks the host if it still has
   the room, every chosen GPU if it is still free and the VM if it is still unplaced, and
   only if it got them all moves the host's counters, gives the GPUs, moves the VM to
   provisioning and opens its usage intervals. Two claims on one host or GPU queue on the
   row and the second sees the first.

A claim that loses a race writes nothing; the view refreshes that host and decides again;
nothing is ever allocated twice, whatever the view said. The VM itself is read under its
row lock by ``pending_locked``, before the decision. A scheduling pass, which has read its
queue, decides first and sends the lock and the claim in one round trip
(``pending_claimed``); the claim is kept only where the lock read the VM it was decided
for.

An RDMA port bound to a host takes one of its virtual functions through ``rdma_vf_claim``
(network asks; the device rows are compute's to write), by the same conditional UPDATE.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from functools import cache
from typing import NamedTuple
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, FilteredRelation, OuterRef, Q, Subquery
from django.utils import timezone

from compute import leases
from compute.choices import DeviceKind, HostState, LeaseState, Priority, VmState
from compute.claims import (
    AdmissionToWeigh,
    ClaimConflict,
    Prepared,
    claim_failure,
    claim_statement,
    claim_undo,
    claim_write,
    claimed,
    devices_give,
    execute_prepared,
)
from compute.models import Device, Host, Lease, PlacementGroup, VirtualMachine
from compute.scheduler import (
    GROUP_FILTERS,
    HostView,
    NoValidHost,
    Placement,
    Request,
    Scheduler,
)
from controlplane import prepared
from controlplane.compiled import Compiled, CompiledRead, CompiledUpdate

log = logging.getLogger(__name__)

CLAIM_ATTEMPTS = 8
LIVE_STATES = [
    VmState.PENDING,
    VmState.PROVISIONING,
    VmState.RUNNING,
    VmState.STOPPED,
    VmState.ERROR,
    VmState.EVICTING,
]


# --- the view -----------------------------------------------------------------------------------


_HOST_COLUMNS = (
    "id",
    "name",
    "rack",
    "vcpus",
    "memory_mib",
    "cpu_allocation_ratio",
    "ram_allocation_ratio",
    "vcpus_used",
    "memory_mib_used",
)
_GPU_COLUMNS = ("host_id", "id", "numa_node", "model", "vm_id", "lease_id", "vm__priority")


def _host_views(
    hosts, *, lease_id: int | None = None, lending: frozenset[int] = frozenset()
) -> list[HostView]:
    """Views of the hosts of queryset ``hosts``: free capacity and free GPUs per cell. A
    GPU a lease holds is free only in the view of that lease (``lease_id``) and in the
    view of a spot VM borrowing from the leases that lend now (``lending``: their ids);
    in every other view it is held (``gpus_held``: CPU VMs leave it its share of the
    host)."""
    gpus = Device.objects.filter(host__in=hosts.values("pk"))
    return _views(_host_rows(hosts), _gpu_rows(gpus), lease_id=lease_id, lending=lending)


def _host_rows(hosts):
    """The rows of queryset ``hosts`` that ``_views`` reads: ``_HOST_COLUMNS``, then each
    host's free RDMA virtual functions (given to no VM, held by no port), counted by the
    database beside its row."""
    free_vfs = (
        Device.objects.filter(
            host=OuterRef("pk"),
            kind=DeviceKind.RDMA_VF,
            vm__isnull=True,
            port__isnull=True,
            present=True,
        )
        .order_by()
        .values("host")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return hosts.annotate(vfs_free=Subquery(free_vfs)).values_list(*_HOST_COLUMNS, "vfs_free")


def _gpu_rows(devices):
    """The rows of the GPUs among queryset ``devices`` that ``_views`` reads."""
    gpus = devices.filter(kind=DeviceKind.GPU, present=True)
    return gpus.values_list(*_GPU_COLUMNS).order_by()


def _one_host(pk: int):
    """``_host_rows`` of open host ``pk`` and ``_gpu_rows`` of its GPUs in one read: the
    host's row once for each of its GPUs (once, its GPU columns null, for a host without)."""
    gpu = FilteredRelation(
        "devices", condition=Q(devices__kind=DeviceKind.GPU, devices__present=True)
    )
    columns = [f"gpu__{name}" for name in _GPU_COLUMNS[1:]]
    return (
        _host_rows(_open_hosts().filter(pk=pk).annotate(gpu=gpu))
        .values_list(*_HOST_COLUMNS, "vfs_free", *columns)
        .order_by()
    )


# ``_one_host``, compiled once (``controlplane.compiled``). The view reads a host again after
# every release of a VM there, and the ORM would build and compile its joins and subquery each
# time (about 3 ms, more than the database takes to answer).
_ONE_HOST = Compiled(_one_host, int)
_HOST_WIDTH = len(_HOST_COLUMNS) + 1  # and its free VFs


def _open_host_view(host_id: int) -> list[HostView]:
    """The view of host ``host_id`` if it is open to new requests (``_open_hosts``), as
    ``_host_views(_open_hosts().filter(pk=host_id))`` makes it, in one read."""
    rows = _ONE_HOST.tuples(host_id)
    if not rows:
        return []
    gpus = [(host_id, *row[_HOST_WIDTH:]) for row in rows if row[_HOST_WIDTH] is not None]
    return _views([rows[0][:_HOST_WIDTH]], gpus)


def _views(
    rows, gpu_rows, *, lease_id: int | None = None, lending: frozenset[int] = frozenset()
) -> list[HostView]:
    """Hosts' views from their rows (``_HOST_COLUMNS`` and the free VFs) and their GPUs'
    (``_GPU_COLUMNS``), as ``_host_views`` says."""
    capacity, views = {}, {}
    for pk, name, rack, vcpus, memory, cpu_ratio, ram_ratio, vused, mused, vfs in rows:
        capacity[pk] = (int(vcpus * cpu_ratio), int(memory * ram_ratio))
        views[pk] = HostView(
            id=pk,
            name=name,
            rack=rack,
            vcpus_free=capacity[pk][0] - vused,
            memory_mib_free=capacity[pk][1] - mused,
            vfs_free=vfs or 0,
        )
    for host_id, device_id, cell, model, vm_id, held_for, priority in gpu_rows:
        host = views[host_id]
        host.gpus_on_demand += priority == Priority.ON_DEMAND
        cell = cell if cell is not None else 0
        host.gpu_model = model
        host.cell_sizes[cell] = host.cell_sizes.get(cell, 0) + 1
        free = host.cells.setdefault(cell, [])
        if vm_id is None and (held_for == lease_id or held_for in lending):
            free.append(device_id)
        elif vm_id is None and lease_id is None:
            host.gpus_held += 1
    reserve = settings.GPU_HOST_CPU_RESERVE
    for view in views.values():
        if view.gpus_total and reserve > 0:
            vcpus, memory = capacity[view.id]
            view.vcpus_per_gpu = int(vcpus * reserve) // view.gpus_total
            view.memory_mib_per_gpu = int(memory * reserve) // view.gpus_total
    return list(views.values())


def _open_hosts():
    """The hosts a new request may be placed on: up, and not being handed over. A host
    whose spot VMs are serving their notice to make room for an on-demand VM (that VM
    waits with ``reserved_host``) takes nobody else until the hand-over: the free part of
    the room it counted on stays free for it."""
    handing_over = VirtualMachine.objects.filter(
        state=VmState.PENDING, reserved_host__isnull=False
    ).values("reserved_host_id")
    return Host.objects.filter(state=HostState.UP).exclude(pk__in=handing_over)


def load_scheduler(*, sample: int | None = None) -> Scheduler:
    """A fresh view of every host open to new requests."""
    return Scheduler(
        _views(_OPEN_HOSTS.tuples(), _OPEN_HOSTS_GPUS.tuples()),
        excluded=len(_HOSTS_NOT_UP.tuples()),
        sample=sample or settings.SCHEDULER_SAMPLE,
        rng=_rng(),
    )


# ``load_scheduler``'s reads, compiled once: a view is loaded again whenever it has aged
# past its TTL, and the ORM would build its joins and subqueries every time.
_OPEN_HOSTS = Compiled(lambda: _host_rows(_open_hosts()))
_OPEN_HOSTS_GPUS = Compiled(
    lambda: _gpu_rows(Device.objects.filter(host__in=_open_hosts().values("pk")))
)
_HOSTS_NOT_UP = Compiled(lambda: Host.objects.exclude(state=HostState.UP).values_list("pk"))
_LENDING = Compiled(
    lambda: Lease.objects.filter(state=LeaseState.ACTIVE, lend_idle=True).values_list("pk")[:1]
)


def _rng() -> random.Random | None:
    """The scheduler's random start among equally good hosts: seeded only by the replay."""
    seed = settings.SCHEDULER_SEED
    return None if seed is None else random.Random(seed)


def view_clock() -> float:
    """Seconds by which the views of this process (hosts here, evictable spot VMs in
    ``compute.services.spot``) age: monotonic time; the replay's simulated time."""
    return time.monotonic()


class _CachedView:
    """This process's view, shared by its threads, reloaded when older than the TTL."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scheduler: Scheduler | None = None
        self.loaded_at = 0.0
        # Whether some active lease lends its idle GPUs, read with the view: a spot VM
        # looks for lent GPUs (``_place_borrowing``) only then.
        self.lends = False

    def get(self, *, fresh: bool = False) -> Scheduler:
        age = view_clock() - self.loaded_at
        fresh = fresh and age > settings.SCHEDULER_FRESH_AFTER_S
        if fresh or self.scheduler is None or age > settings.SCHEDULER_VIEW_TTL_S:
            self.scheduler = load_scheduler()
            self.lends = bool(_LENDING.tuples())
            self.loaded_at = view_clock()
        return self.scheduler

    def refresh_host(self, host_id: int) -> None:
        if self.scheduler is None:
            return
        views = _open_host_view(host_id)
        self.scheduler.remove(host_id)
        for view in views:
            self.scheduler.add(view)

    def forget(
        self, scheduler: Scheduler, placement: Placement, req: Request, failure: Exception | None
    ) -> None:
        """Forget what ``scheduler`` reserved for a claim that failed with ``failure``. A
        claim that wrote nothing because its admission had something to weigh, while the
        room it counted on held (``AdmissionToWeigh.room_held``), did not show the view
        wrong: the reservation is given back in memory (a view loaded since holds none).
        Otherwise the host is read again."""
        if isinstance(failure, AdmissionToWeigh) and failure.room_held:
            self.give_back(scheduler, placement, req)
        else:
            self.refresh_host(placement.host_id)

    def give_back(self, scheduler: Scheduler, placement: Placement, req: Request) -> None:
        """Give back in memory what ``scheduler`` reserved for a claim not made."""
        if self.scheduler is scheduler:
            scheduler.unreserve(placement, req)

    def invalidate(self) -> None:
        self.scheduler = None


view = _CachedView()


# --- the VM to place ----------------------------------------------------------------------------


def _pending(pk, *, skip_locked: bool):
    return (
        VirtualMachine.objects.select_for_update(skip_locked=skip_locked, of=("self",))
        .select_related("project", "image", "placement_group")
        .filter(pk=pk, state=VmState.PENDING, reserved_host__isnull=True)
        .order_by()
    )


def pending_locked(pk, *, skip_locked: bool = False) -> VirtualMachine | None:
    """The pending VM ``pk`` that waits for no evictions, with its project, image and
    placement group, its own row locked for update until the caller's transaction ends;
    None when it is no longer such a VM (or, with ``skip_locked``, while another
    transaction holds it). What a scheduler reads before it places a VM.

    On PostgreSQL the ORM's SQL for it is compiled once (``_PENDING``) and runs as a
    prepared statement of the connection, in a savepoint, the way the claim runs
    (``compute.claims.execute_prepared``): compiling the query and planning it again for
    every VM would cost more than the claim that follows. The VM and its related objects
    are built from the row as the ORM builds them. Elsewhere it is the ORM's query itself."""
    if connection.vendor != "postgresql":
        return _pending(pk, skip_locked=skip_locked).first()
    read = _PENDING[skip_locked].read()
    with prepared.client_cursor(connection) as cursor:
        (rows,) = execute_prepared(cursor, _lock_statement(read, pk))
    return _first(read.built(rows))


#: ``_pending``, compiled (``controlplane.compiled``), by ``skip_locked``.
_PENDING = {
    skip: Compiled(lambda pk, skip=skip: _pending(pk, skip_locked=skip), UUID)
    for skip in (False, True)
}


def _lock_statement(read: CompiledRead, pk) -> Prepared:
    """The lock of VM ``pk`` (``read``: ``_PENDING``'s), as ``execute_prepared`` runs it,
    its parameters named; its rows for ``read.built``."""
    params = {f"p{i}": value for i, value in enumerate(read.bound((pk,)))}
    return Prepared(_named(read.sql), params, savepoint="kumo_lock", prefix="kumo_lock_")


@cache
def _named(sql: str) -> str:
    """``sql`` with its parameters named ``p0``, ``p1``, … in order."""
    if "%%" in sql:
        raise AssertionError(f"the pending VM query cannot be prepared: {sql}")
    parts = sql.split("%s")
    return parts[0] + "".join(f"%(p{i})s{part}" for i, part in enumerate(parts[1:]))


def _first(objects: list):
    return objects[0] if objects else None


class Queued(NamedTuple):
    """A pending VM as a scheduling pass's queue read it, unlocked: what a decision for it,
    the admission condition of its claim and the usage intervals its claim opens depend
    on. ``queue.values_list(*Queued._fields)`` reads it; ``Queued.of(vm)`` is the same of
    a VM object, to compare."""

    pk: UUID
    project_id: int
    name: str
    priority: str
    vcpus: int
    memory_mib: int
    gpus: int
    gpu_model: str
    rdma_vfs: int
    disk_gib: int
    kept_disk: str
    placement_group_id: int | None
    lease_id: int | None
    generation: int

    @classmethod
    def of(cls, vm: VirtualMachine) -> Queued:
        return cls._make(getattr(vm, field) for field in cls._fields)


def pending_claimed(queued: Queued) -> tuple[VirtualMachine | None, Placement | None]:
    """``pending_locked(queued.pk, skip_locked=True)`` and, in the same round trip, the
    claim of the place this process's view picks for the VM as ``queued`` read it: a
    scheduling pass's VM is locked and placed in one round trip. Returns the locked VM
    (None when it is no longer pending, or another transaction holds it) and, when that
    claim holds, its placement (``vm`` is then updated in place, as ``place`` leaves it);
    without a placement the caller places the VM (``place``), which decides again.

    The claim is kept only where the lock read the VM that the decision was made for
    (``Queued.of(vm) == queued``): otherwise, or when it lost a race, or when its
    admission had something to weigh, it is rolled back and the view forgets its
    reservation. The claim skips a VM row another transaction holds, as the lock does, so
    it never waits for one. A VM in a placement group or a lease, or one the view has no
    room for, is only locked; so is every VM on SQLite."""
    if (
        connection.vendor != "postgresql"
        or queued.placement_group_id is not None
        or queued.lease_id is not None
    ):
        return pending_locked(queued.pk, skip_locked=True), None
    from compute import guarantees

    req = Request(
        vcpus=queued.vcpus,
        memory_mib=queued.memory_mib,
        gpus=queued.gpus,
        gpu_model=queued.gpu_model,
        rdma_vfs=queued.rdma_vfs,
    )
    with view.lock:
        scheduler = view.get()
        try:
            chosen = scheduler.select(req)
        except NoValidHost:
            chosen = None
        else:
            scheduler.reserve(chosen, req)
    if chosen is None:
        return pending_locked(queued.pk, skip_locked=True), None
    lock = _PENDING[True].read()
    now = timezone.now()
    claim = claim_statement(
        queued,
        chosen,
        req,
        at=now,
        admitted_if=guarantees.nothing_to_weigh(queued),
        skip_locked_vm=True,
    )
    with prepared.client_cursor(connection) as cursor:
        rows, (answer,) = execute_prepared(cursor, _lock_statement(lock, queued.pk), claim)
    vm = _first(lock.built(rows))
    failure = claim_failure(answer, queued, chosen)
    if vm is not None and Queued.of(vm) == queued and failure is None:
        claimed(vm, chosen, at=now)
        _log_placed(vm, chosen)
        return vm, chosen
    claim_undo()
    if vm is not None and isinstance(failure, ClaimConflict):
        log.info("vm %s: claim on %s lost a race (%s)", vm.pk, chosen.host_name, failure)
    with view.lock:
        view.forget(scheduler, chosen, req, failure)
    return vm, None


# --- requests -----------------------------------------------------------------------------------


def request_for(vm: VirtualMachine, *, group_locked: bool = False) -> Request:
    """The scheduler's request for ``vm``, with where its group's members already are."""
    policy, hosts, racks = "", frozenset(), frozenset()
    if vm.placement_group_id is not None:
        group = vm.placement_group
        policy = group.policy
        members = (
            VirtualMachine.objects.filter(
                placement_group_id=group.pk, host__isnull=False, state__in=LIVE_STATES
            )
            .exclude(pk=vm.pk)
            .values_list("host_id", "rack")
        )
        pairs = list(members)
        hosts = frozenset(h for h, _ in pairs)
        racks = frozenset(r for _, r in pairs)
    return Request(
        vcpus=vm.vcpus,
        memory_mib=vm.memory_mib,
        gpus=vm.gpus,
        gpu_model=vm.gpu_model,
        rdma_vfs=vm.rdma_vfs,
        group_policy=policy,
        group_hosts=hosts,
        group_racks=racks,
        on_demand=vm.priority == Priority.ON_DEMAND,
    )


# --- the claim ----------------------------------------------------------------------------------


def rdma_vf_claim(*, host_id: int, vm_id: UUID | None) -> Device | None:
    """The first free RDMA virtual function of host ``host_id`` by PCI address, for a port
    being bound there: given to no VM and held by no port (a port without a VM holds its VF
    through ``Port.vf`` alone, whose uniqueness keeps two ports off one VF). With ``vm_id``
    it is given to that VM by the same conditional UPDATE as a GPU claim. None when the
    host has no free VF; the caller answers that."""
    vf = (
        Device.objects.filter(host_id=host_id, kind=DeviceKind.RDMA_VF, vm__isnull=True)
        .exclude(port__isnull=False)
        .order_by("pci_address")
        .first()
    )
    if vf is not None and vm_id is not None:
        devices_give([vf.pk], vm_id)
    elif vf is not None:
        vfs_changed(host_id)
    return vf


def vfs_changed(host_id: int) -> None:
    """A port outside any claim took or gave back one of host ``host_id``'s RDMA virtual
    functions: once that commits, this process's view reads the host again. (A claim's
    own VFs are its reservation in the view; other processes' views learn of it at their
    next load, and a claim made on a view that missed it finds no VF and is undone.)"""
    _refresh_after_commit(host_id)


def claim(
    vm: VirtualMachine,
    placement: Placement,
    req: Request,
    *,
    admitted_if: tuple[str, dict] | None = None,
    borrow: bool = False,
) -> None:
    """Claim ``placement`` for ``vm`` inside the caller's transaction; raises ClaimConflict,
    leaving nothing written, when the database disagrees (``admitted_if``, ``borrow``: see
    ``compute.claims.claim_write``). A member of a placement group first locks its group's
    row and re-checks the policy against the members placed by then, so two members are
    placed one after the other; then ``compute.claims`` writes the claim, all of it or
    nothing."""
    if vm.placement_group_id is not None:
        PlacementGroup.objects.select_for_update().get(pk=vm.placement_group_id)
        current = request_for(vm)
        probe = HostView(id=placement.host_id, name=placement.host_name, rack=placement.rack)
        if not all(check(probe, current) for check in GROUP_FILTERS):
            raise ClaimConflict("another member of the placement group was placed meanwhile")
    claim_write(vm, placement, req, admitted_if=admitted_if, borrow=borrow)


def place(vm: VirtualMachine) -> Placement:
    """Decide and claim a host for ``vm`` in the caller's transaction.

    Retries a lost race on a refreshed view; when nothing fits even on a fresh view, raises
    ``NoValidHost`` with the reason for the user. An on-demand VM that would take other
    projects' guaranteed headroom is refused (``compute.guarantees``): the claim itself
    checks that there is nothing to weigh (no other project's guarantee, no lease of its
    GPU model), the common case; where there is, ``admission_refusal`` decides, and a
    refused VM takes nothing, with the refusal as its reason. Once weighed, one that would
    take the first GPU on a host while a lease of whole hosts needs every such host is
    refused too (``compute.guarantees.whole_hosts_refusal``; the scheduler tries hosts
    on-demand work already holds first). A spot GPU VM that finds no room may borrow a
    lease's idle GPUs (``_place_borrowing``).
    """
    req = request_for(vm)
    if vm.lease_id is not None:
        return _place_in_lease(vm, req)
    from compute import guarantees

    admitted_if = guarantees.nothing_to_weigh(vm)  # None: admitted once weighed (or spot)
    weighed = False  # weighed in this transaction, and admitted
    if admitted_if is not None and _weighs_lately(vm):
        _raise_if_refused(vm, req, to_weigh=True)  # weighed first: a claim would fail
        admitted_if, weighed = None, True
    borrows = vm.priority == Priority.SPOT and bool(vm.gpus)
    fresh = False
    for _attempt in range(CLAIM_ATTEMPTS):
        with view.lock:
            scheduler = view.get(fresh=fresh)
            try:
                placement, nothing = scheduler.select(req), None
                scheduler.reserve(placement, req)
            except NoValidHost as e:
                nothing = e
        if nothing is not None:
            if admitted_if is not None:  # weighed first: the refusal is the better reason
                _raise_if_refused(vm, req)
                admitted_if, weighed = None, True
            if fresh:
                if borrows:
                    return _place_borrowing(vm, req, nothing)
                nothing.admitted = weighed
                raise nothing
            fresh = True  # the view may be stale: look once more on a fresh one
            continue
        if admitted_if is None:  # weighed: so is the host it would keep from being whole
            refusal = guarantees.whole_hosts_refusal(vm, placement.host_id)
            if refusal:
                with view.lock:
                    view.give_back(scheduler, placement, req)
                raise NoValidHost(req, 0, Counter(), 0, reason=refusal)
        try:
            claim(vm, placement, req, admitted_if=admitted_if)
        except (ClaimConflict, AdmissionToWeigh) as e:
            with view.lock:
                view.forget(scheduler, placement, req, e)
            if isinstance(e, AdmissionToWeigh):
                _WEIGHED[_weighing_key(vm)] = view_clock()
                _raise_if_refused(vm, req, to_weigh=True)
                admitted_if, weighed = None, True
                continue
            log.info("vm %s: claim on %s lost a race (%s)", vm.pk, placement.host_name, e)
            if vm.placement_group_id is not None:
                req = request_for(vm)
            continue
        _log_placed(vm, placement)
        return placement
    raise NoValidHost(
        req,
        len(view.get().hosts),
        Counter(),
        0,
        reason=f"lost {CLAIM_ATTEMPTS} placement races to concurrent requests; will retry",
    )


#: When a claim of this process last found each kind of on-demand request
#: (``_weighing_key``) with something to weigh, by the clock its view ages by.
_WEIGHED: dict[tuple, float] = {}


def _weighing_key(vm: VirtualMachine) -> tuple:
    return (vm.project_id, bool(vm.gpus), vm.gpu_model)


def _weighs_lately(vm: VirtualMachine) -> bool:
    """Whether a claim of this process found the on-demand ``vm``'s kind of request (its
    project, whether it asks for GPUs, their model) with something to weigh
    (``AdmissionToWeigh``) no longer ago than the view lives (``KUMO_SCHEDULER_VIEW_TTL_S``):
    guarantees and leases change far less often than requests come. ``place`` then weighs
    the request before it claims, rather than claim on the condition that there is nothing
    to weigh, a claim that would be undone. A hint, never a decision: the weighing reads
    the database, and a claim on the condition finds out again once the hint is old."""
    seen = _WEIGHED.get(_weighing_key(vm))
    return seen is not None and view_clock() - seen <= settings.SCHEDULER_VIEW_TTL_S


def _log_placed(vm: VirtualMachine, placement: Placement) -> None:
    log.info(
        "vm %s placed on %s cell %s gpus %s (generation %d)",
        vm.pk,
        placement.host_name,
        placement.numa_cell,
        len(placement.device_ids),
        vm.generation,
    )


def no_room(req: Request, *, look_fresh: bool = True) -> str:
    """Why no host has room for ``req`` in this process's view, after the fresh look
    ``place`` would take too (unless not ``look_fresh``: the caller looked already); "" when
    some host may. Decides only: nothing is reserved, no VM is read. For a request with no
    placement group or lease, whose admission weighs nothing (a spot VM's): ``place`` would
    refuse it for the same reason."""
    reason = ""
    for fresh in (False, True) if look_fresh else (False,):
        with view.lock:
            try:
                view.get(fresh=fresh).select(req)
            except NoValidHost as e:
                reason = e.reason
            else:
                return ""
    if not req.on_demand and req.gpus:
        borrowing = _borrowing_scheduler(req)
        if borrowing is not None:
            try:
                borrowing.select(req)
            except NoValidHost:
                pass
            else:
                return ""
    return reason


def _raise_if_refused(vm: VirtualMachine, req: Request, *, to_weigh: bool = False) -> None:
    from compute import guarantees

    refusal = guarantees.admission_refusal(vm, to_weigh=to_weigh)
    if refusal:
        raise NoValidHost(req, 0, Counter(), 0, reason=refusal)


def lease_views(lease_id: int) -> list[HostView]:
    """Views of the hosts (up) where lease ``lease_id`` holds GPUs: its idle ones free."""
    hosts = Host.objects.filter(
        state=HostState.UP, pk__in=Device.objects.filter(lease_id=lease_id).values("host_id")
    )
    return _host_views(hosts, lease_id=lease_id)


def _place_in_lease(vm: VirtualMachine, req: Request) -> Placement:
    """Place ``vm`` on its lease's GPUs, from the database (a lease holds few hosts)."""
    refusal = leases.placement_refusal(vm)
    if refusal:
        raise NoValidHost(req, 0, Counter(), 0, reason=refusal)
    for _attempt in range(CLAIM_ATTEMPTS):
        scheduler = Scheduler(lease_views(vm.lease_id), rng=_rng())
        try:
            chosen = scheduler.select(req)
        except NoValidHost as e:
            raise NoValidHost(
                req, 0, Counter(), 0, reason=f"its lease has no room left for it: {e.reason}"
            ) from e
        try:
            claim(vm, chosen, req)
        except ClaimConflict as e:  # another VM took the room meanwhile: read again
            log.info("vm %s: claim in its lease on %s lost a race (%s)", vm.pk, chosen.host_name, e)
            continue
        log.info("vm %s placed in its lease on %s", vm.pk, chosen.host_name)
        return chosen
    raise NoValidHost(
        req,
        0,
        Counter(),
        0,
        reason=f"lost {CLAIM_ATTEMPTS} placement races in its lease to concurrent requests; "
        "will retry",
    )


# --- spot VMs on a lease's idle GPUs --------------------------------------------------------


def _lending_idle(req: Request) -> frozenset[int]:
    """The leases lending GPUs of ``req``'s model now (active, ``lend_idle``) that have an
    idle one: what a spot VM may borrow. Without a query while this process's view (as
    fresh as the caller's last look) knows of no lease that lends."""
    with view.lock:
        if not view.lends:
            return frozenset()
    idle = Device.objects.filter(
        kind=DeviceKind.GPU,
        vm__isnull=True,
        present=True,
        lease__state=LeaseState.ACTIVE,
        lease__lend_idle=True,
    )
    if req.gpu_model:
        idle = idle.filter(model=req.gpu_model)
    return frozenset(idle.values_list("lease_id", flat=True).distinct().order_by())


def _borrowing_scheduler(req: Request) -> Scheduler | None:
    """A view, from the database, of the open hosts where lending leases have idle GPUs,
    those GPUs free in it beside the hosts' own; None when no lease lends one now."""
    lending = _lending_idle(req)
    if not lending:
        return None
    hosts = _open_hosts().filter(
        pk__in=Device.objects.filter(lease_id__in=lending, vm__isnull=True).values("host_id")
    )
    return Scheduler(_host_views(hosts, lending=lending), rng=_rng())


def _place_borrowing(vm: VirtualMachine, req: Request, nothing: NoValidHost) -> Placement:
    """Place the spot ``vm``, for which the fleet's free GPUs have no room (``nothing``),
    on GPUs that leases lend while their own VMs leave them idle. A lease's VM that needs
    them gives the borrower its eviction notice (``compute.services.spot.preempt_for``),
    as an on-demand VM does. Raises ``nothing`` when no lease lends room for it either."""
    borrowing = _borrowing_scheduler(req)
    if borrowing is None:
        raise nothing
    try:
        chosen = borrowing.select(req)
    except NoValidHost:
        raise nothing from None
    try:
        claim(vm, chosen, req, borrow=True)
    except ClaimConflict as e:
        log.info("vm %s: claim of lent GPUs on %s lost a race (%s)", vm.pk, chosen.host_name, e)
        raise nothing from None  # it waits; the next pass decides again
    _refresh_after_commit(chosen.host_id)  # the cached view holds lent GPUs as held
    log.info("vm %s placed on %s, on GPUs a lease lends", vm.pk, chosen.host_name)
    return chosen


def place_on(vm: VirtualMachine, host_id: int) -> Placement:
    """Decide and claim room for ``vm`` on host ``host_id`` alone, from the database as this
    transaction sees it (the room spot evictions freed in it); raises ``NoValidHost`` or
    ``ClaimConflict``."""
    req = request_for(vm)
    hosts = Host.objects.filter(pk=host_id, state=HostState.UP)
    scheduler = Scheduler(_host_views(hosts, lease_id=vm.lease_id))
    chosen = scheduler.select(req)
    claim(vm, chosen, req)
    log.info(
        "vm %s placed on %s after evictions (generation %d)", vm.pk, chosen.host_name, vm.generation
    )
    return chosen


def release(vm: VirtualMachine) -> None:
    """Give back what ``vm`` holds on its host: its devices and its share of the counters.
    Call once, in the transaction that moves the VM to a state that holds nothing."""
    if vm.host_id is None:
        return
    _FREE_DEVICES.run(vm.pk)
    _GIVE_BACK.run(vm.host_id, vm.vcpus, vm.memory_mib)
    _refresh_after_commit(vm.host_id)
    _pass_after_commit()


# A release's two writes, compiled once: every deleted, evicted or shelved VM makes them.
_FREE_DEVICES = CompiledUpdate(
    lambda vm_id: (Device.objects.filter(vm_id=vm_id), {"vm": None}), UUID
)
_GIVE_BACK = CompiledUpdate(
    lambda pk, vcpus, memory_mib: (
        Host.objects.filter(pk=pk),
        {
            "vcpus_used": F("vcpus_used") - vcpus,
            "memory_mib_used": F("memory_mib_used") - memory_mib,
        },
    ),
    int,
    int,
    int,
)

# The cache key a release sets when it asks for a pass: the releases after it, while it
# lives, find the pass asked for.
_PASS_ASKED = "kumo.compute.pass-asked"


def _pass_after_commit() -> None:
    """Once the caller commits the release, ask for a scheduling pass
    (``vm_schedule_pending``, a control task) ``KUMO_SCHEDULE_ON_RELEASE_S`` from then, so
    a VM waiting for the room takes it then rather than at beat's next pass. The first
    release asks; the ones after it, until that pass is due, find it asked (a cache key
    that lives as long as the delay: each of them committed before the pass begins). A
    lost message costs only the wait for beat's pass."""
    delay = settings.SCHEDULE_ON_RELEASE_S
    if not delay:
        return

    def ask() -> None:
        from django.core.cache import cache

        from compute.protocol import SCHEDULE_PENDING_TASK
        from controlplane.celery import app

        if cache.add(_PASS_ASKED, True, timeout=delay):
            app.send_task(
                SCHEDULE_PENDING_TASK,
                kwargs={},
                queue=settings.CELERY_TASK_DEFAULT_QUEUE,
                countdown=delay,
            )

    transaction.on_commit(ask, robust=True)


def _refresh_after_commit(host_id: int) -> None:
    """Read host ``host_id`` into this process's view again once the caller commits."""

    def refresh():
        with view.lock:
            view.refresh_host(host_id)

    transaction.on_commit(refresh, robust=True)
