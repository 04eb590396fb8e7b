"""Placement decisions: small filters and weighers over an in-memory view of the hosts.

No database here: ``compute.placement`` loads the view, asks for a decision, and claims it
in a transaction that re-checks everything (the view may be stale; the claim never is).

The rules:

* 1 to 4 GPUs come from one NUMA cell (the vCPUs are pinned to it); more take a whole
  node (8 on an 8-GPU host).
* GPU VMs pack: the host and cell with the fewest free GPUs that still fit, so whole
  nodes stay free for 8-GPU VMs. On-demand VMs of 1 to 4 GPUs go first to hosts already
  "pinned" (some GPU held by an on-demand VM or a lease, which no eviction frees), so
  that the hosts holding only spot VMs stay hosts that evictions can empty for an 8-GPU
  on-demand VM. CPU VMs spread (most free vCPUs) and keep off GPU hosts
  while CPU hosts have room; on a GPU host they take only what its free GPUs do not need
  (``gpu_reserve_filter``), so no GPU is ever stranded by CPU work.
* Placement groups: affinity (the members' host), anti-affinity (a host with no member),
  compact (the members' rack).
* Only hosts that are up are in the view: drained, in maintenance or down take nothing.

Speed: a decision must not walk 5,000 hosts. GPU hosts are indexed by their pattern of free
GPUs per cell (few distinct patterns exist), visited tightest fit first, so the first that
passes the filters is the best (the weighers rank hosts as that order does); CPU requests
walk from a rotating start and weigh only the first ``sample`` hosts that pass the filters,
as kube-scheduler scores a subset of feasible nodes.

Concurrent schedulers: several processes decide on views that do not see each other's
reservations. Were equally good hosts visited in the same order everywhere, every process
would pick the same host for its next VM and all but one would lose the claim, in lockstep
(Nova's ``shuffle_best_same_weighed_hosts`` answers the same problem). So each scheduler
visits the hosts of one GPU pattern from a random point: the fit is as tight, and processes
fill different hosts.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field


class _Ids:
    """Host ids, added and discarded in O(1) and read by position, so that a decision can
    start at a random one without copying thousands (a set cannot be indexed)."""

    __slots__ = ("_at", "items")

    def __init__(self) -> None:
        self.items: list[int] = []
        self._at: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, host_id: int) -> None:
        if host_id not in self._at:
            self._at[host_id] = len(self.items)
            self.items.append(host_id)

    def discard(self, host_id: int) -> None:
        at = self._at.pop(host_id, None)
        if at is None:
            return
        last = self.items.pop()
        if last != host_id:  # the last one takes the place of the one that left
            self.items[at] = last
            self._at[last] = at


@dataclass
class HostView:
    """One schedulable host as the scheduler sees it. ``cells`` maps a NUMA cell to the ids
    of its free GPUs; ``cell_sizes`` to how many GPUs it has in all."""

    id: int
    name: str
    rack: str = ""
    vcpus_free: int = 0
    memory_mib_free: int = 0
    gpu_model: str = ""
    cells: dict[int, list[int]] = field(default_factory=dict)
    cell_sizes: dict[int, int] = field(default_factory=dict)
    # What each free GPU needs of the host's vCPUs and memory to be usable, held back
    # from CPU VMs (``gpu_reserve_filter``); 0 holds nothing back.
    vcpus_per_gpu: int = 0
    memory_mib_per_gpu: int = 0
    # Free GPUs a lease holds: not this view's to give, but CPU VMs leave them their share.
    gpus_held: int = 0
    # GPUs held by on-demand VMs: no eviction frees them.
    gpus_on_demand: int = 0
    # RDMA NIC virtual functions given to no VM and held by no port.
    vfs_free: int = 0

    @property
    def gpus_total(self) -> int:
        return sum(self.cell_sizes.values())

    @property
    def gpus_free(self) -> int:
        return sum(len(free) for free in self.cells.values())

    def pattern(self) -> tuple[int, ...]:
        """Free GPUs per cell, in cell order: the key of the GPU index."""
        return tuple(len(self.cells[cell]) for cell in sorted(self.cells))

    @property
    def pinned(self) -> bool:
        """Whether some GPU here is held by what no eviction frees (an on-demand VM, a
        lease): evicting spot VMs cannot empty this host for a whole-node request."""
        return bool(self.gpus_on_demand or self.gpus_held)


@dataclass(frozen=True)
class Request:
    """What one VM needs. ``group_hosts`` / ``group_racks``: where its placement group's
    other members already are."""

    vcpus: int
    memory_mib: int
    gpus: int = 0
    gpu_model: str = ""
    rdma_vfs: int = 0  # one per port on an RDMA network
    group_policy: str = ""
    group_hosts: frozenset[int] = frozenset()
    group_racks: frozenset[str] = frozenset()
    on_demand: bool = False  # an on-demand VM's: no eviction frees what it takes


@dataclass(frozen=True)
class Placement:
    host_id: int
    host_name: str
    numa_cell: int | None
    device_ids: tuple[int, ...]
    rack: str = ""


# How every reason of ``NoValidHost`` for want of room begins; the rest names the request
# (its vCPUs, memory, GPUs and where they must be) and then counts the hosts.
NO_ROOM = "no host has"


class NoValidHost(Exception):
    """Nothing fits. ``reason`` is a sentence for the user; ``rejected`` counts, per filter,
    the hosts it turned away. ``admitted``: the on-demand request's admission was weighed
    in the caller's transaction and took nothing from anyone's guarantee or lease
    (``compute.placement.place`` says so): a preemption for it need not weigh it again."""

    admitted = False

    def __init__(
        self,
        request: Request,
        considered: int,
        rejected: Counter,
        excluded: int,
        *,
        reason: str = "",
    ):
        self.request = request
        self.rejected = rejected
        what = f"{request.vcpus} vCPUs, {request.memory_mib // 1024} GiB"
        if request.gpus:
            where = "on one NUMA cell" if request.gpus <= 4 else "on one whole node"
            what += f", {request.gpus} {request.gpu_model or 'GPU'} GPUs {where}"
        if request.rdma_vfs:
            what += f", {request.rdma_vfs} RDMA virtual function(s)"
        parts = [f"{count} {FILTER_REASONS[name]}" for name, count in rejected.most_common()]
        if excluded:
            parts.append(f"{excluded} not in service (draining, maintenance or down)")
        self.reason = reason or f"{NO_ROOM} {what} free: {considered} hosts up" + (
            f"; {', '.join(parts)}" if parts else ""
        )
        super().__init__(self.reason)


# --- filters: (host, request) -> passes? ------------------------------------------------------

Filter = Callable[[HostView, Request], bool]


def capacity_filter(host: HostView, req: Request) -> bool:
    return host.vcpus_free >= req.vcpus and host.memory_mib_free >= req.memory_mib


def gpu_filter(host: HostView, req: Request) -> bool:
    if req.gpus == 0:
        return True
    if req.gpu_model and host.gpu_model != req.gpu_model:
        return False
    return _pick_cell(host, req.gpus) is not False


def gpu_reserve_filter(host: HostView, req: Request) -> bool:
    """No GPU stranded by CPU work: a CPU VM takes only the vCPUs and memory a GPU host does
    not need for its free GPUs (each free GPU keeps ``vcpus_per_gpu`` and
    ``memory_mib_per_gpu``, the host's share per GPU times ``KUMO_GPU_HOST_CPU_RESERVE``).
    Applied while the view holds CPU hosts (``Scheduler.select``): a fleet of GPU hosts
    only has nowhere else for CPU VMs to go."""
    free = host.gpus_free + host.gpus_held
    if req.gpus or not free:
        return True
    return (
        host.vcpus_free - req.vcpus >= free * host.vcpus_per_gpu
        and host.memory_mib_free - req.memory_mib >= free * host.memory_mib_per_gpu
    )


def rdma_filter(host: HostView, req: Request) -> bool:
    """A VM with ports on RDMA networks needs a free virtual function of the host's RDMA
    NIC for each."""
    return host.vfs_free >= req.rdma_vfs


def affinity_filter(host: HostView, req: Request) -> bool:
    return req.group_policy != "affinity" or not req.group_hosts or host.id in req.group_hosts


def anti_affinity_filter(host: HostView, req: Request) -> bool:
    return req.group_policy != "anti_affinity" or host.id not in req.group_hosts


def compact_filter(host: HostView, req: Request) -> bool:
    return req.group_policy != "compact" or not req.group_racks or host.rack in req.group_racks


GROUP_FILTERS = (affinity_filter, anti_affinity_filter, compact_filter)

FILTERS: dict[str, Filter] = {
    "gpu": gpu_filter,
    "capacity": capacity_filter,
    "gpu_reserve": gpu_reserve_filter,
    "rdma": rdma_filter,
    "affinity": affinity_filter,
    "anti_affinity": anti_affinity_filter,
    "compact": compact_filter,
}
# The filters without the GPU reserve, for a view with no CPU host.
FILTERS_NO_RESERVE = {name: f for name, f in FILTERS.items() if name != "gpu_reserve"}
FILTER_REASONS = {
    "gpu": "without enough free GPUs of that model",
    "capacity": "without enough free vCPUs or memory",
    "gpu_reserve": "GPU hosts whose spare vCPUs and memory their free GPUs need",
    "rdma": "without enough free RDMA virtual functions",
    "affinity": "not the host of the placement group (affinity)",
    "anti_affinity": "already hold a member of the placement group (anti-affinity)",
    "compact": "outside the placement group's rack (compact)",
}


# --- weighers: (host, request) -> score, higher is better -------------------------------------


def pack_gpus_weigher(host: HostView, req: Request) -> float:
    """GPU VMs: the tightest cell first (fewest free GPUs that still fit), then the host
    with the fewest free GPUs: whole cells and whole nodes stay whole. Of hosts alike, a
    pinned one (``HostView.pinned``) first. An on-demand VM that takes part of a node goes
    to a pinned host first, however loose the fit: on-demand work gathers on fewer hosts,
    and the others stay hosts that evicting spot VMs can empty for a whole-node request."""
    if not req.gpus:
        return 0.0
    cell = _pick_cell(host, req.gpus)
    cell_free = len(host.cells[cell]) if isinstance(cell, int) and cell is not False else 0
    pinned_first = 4096.0 if req.on_demand and cell is not None else 0.5
    return -float(cell_free * 64 + host.gpus_free) + (pinned_first if host.pinned else 0)


def spread_cpus_weigher(host: HostView, req: Request) -> float:
    """CPU VMs: more free vCPUs is better, and GPU hosts are kept for GPU work."""
    if req.gpus:
        return 0.0
    return host.vcpus_free - (1_000_000.0 if host.gpus_total else 0.0)


WEIGHERS = (pack_gpus_weigher, spread_cpus_weigher)


def _pick_cell(host: HostView, gpus: int) -> int | bool | None:
    """The cell to take ``gpus`` from (tightest fit), ``None`` for a whole-node request that
    fits, ``False`` when it does not fit."""
    if gpus > max(host.cell_sizes.values(), default=0):
        fits = host.gpus_free >= gpus and host.gpus_free == host.gpus_total
        return None if fits else False
    fitting = [(len(free), cell) for cell, free in host.cells.items() if len(free) >= gpus]
    return min(fitting)[1] if fitting else False


def _index_key(host: HostView) -> tuple[str, tuple[int, ...], bool]:
    """A GPU host's key in the scheduler's index: its GPU model, pattern and pinning."""
    return (host.gpu_model, host.pattern(), host.pinned)


def _pack_order(pattern: tuple[int, ...], gpus: int) -> tuple[int, int] | None:
    """Sort key of a free-GPU pattern for a request of ``gpus``; ``None`` if none fits."""
    if gpus <= 4:
        fitting = [free for free in pattern if free >= gpus]
        return (min(fitting), sum(pattern)) if fitting else None
    return (0, sum(pattern)) if sum(pattern) >= gpus else None


class Scheduler:
    """Decisions over one view of the hosts. Not thread-safe: callers serialise ``select``
    with ``reserve``/``unreserve`` (``compute.placement`` holds a lock)."""

    def __init__(
        self,
        hosts: Iterable[HostView],
        *,
        excluded: int = 0,
        sample: int = 16,
        rng: random.Random | None = None,
    ):
        self.hosts: dict[int, HostView] = {}
        self.excluded = excluded
        self.sample = sample
        self._rng = rng or random.Random()  # where to start among equally good GPU hosts
        self._cpu_order = _Ids()
        self._gpu_index: dict[tuple[str, tuple[int, ...], bool], _Ids] = defaultdict(_Ids)
        self._start = itertools.count()
        self._cpu_hosts = 0  # hosts of the view with no GPU
        for host in hosts:
            self.add(host)

    # -- the view ------------------------------------------------------------------------------

    def add(self, host: HostView) -> None:
        if host.id in self.hosts:
            self.remove(host.id)
        self.hosts[host.id] = host
        self._cpu_order.add(host.id)
        if host.gpus_total:
            self._gpu_index[_index_key(host)].add(host.id)
        else:
            self._cpu_hosts += 1

    def remove(self, host_id: int) -> None:
        host = self.hosts.pop(host_id, None)
        if host is None:
            return
        self._cpu_order.discard(host_id)
        if host.gpus_total:
            self._gpu_index[_index_key(host)].discard(host_id)
        else:
            self._cpu_hosts -= 1

    def reserve(self, placement: Placement, req: Request) -> None:
        """Take what ``placement`` holds out of the view (before the claim commits)."""
        self._change(placement, req, sign=-1)

    def unreserve(self, placement: Placement, req: Request) -> None:
        """Give back a reservation whose claim failed."""
        self._change(placement, req, sign=+1)

    def _change(self, placement: Placement, req: Request, *, sign: int) -> None:
        host = self.hosts.get(placement.host_id)
        if host is None:
            return
        key = _index_key(host)
        host.vcpus_free += sign * req.vcpus
        host.memory_mib_free += sign * req.memory_mib
        host.vfs_free += sign * req.rdma_vfs
        if placement.device_ids:
            self._gpu_index[key].discard(host.id)
            if sign < 0:
                taken = set(placement.device_ids)
                for cell in host.cells:
                    host.cells[cell] = [d for d in host.cells[cell] if d not in taken]
            else:
                # Given back to their cells; which cell each was on is in the claim's view.
                for device_id, cell in zip(
                    placement.device_ids, self._cells_of(placement), strict=True
                ):
                    host.cells[cell].append(device_id)
            if req.on_demand:
                host.gpus_on_demand -= sign * len(placement.device_ids)
            self._gpu_index[_index_key(host)].add(host.id)

    def _cells_of(self, placement: Placement) -> list[int]:
        host = self.hosts[placement.host_id]
        if placement.numa_cell is not None:
            return [placement.numa_cell] * len(placement.device_ids)
        # Whole node: GPUs go back cell by cell up to each cell's size.
        cells = []
        for cell in sorted(host.cell_sizes):
            cells.extend([cell] * (host.cell_sizes[cell] - len(host.cells[cell])))
        return cells[: len(placement.device_ids)]

    # -- decisions -----------------------------------------------------------------------------

    def select(self, req: Request) -> Placement:
        """The best host for ``req`` in this view; ``NoValidHost`` when nothing fits."""
        rejected: Counter = Counter()
        feasible: list[HostView] = []
        visited = 0
        filters = FILTERS if self._cpu_hosts else FILTERS_NO_RESERVE
        # The GPU index offers hosts best first (``_gpu_candidates``): the first that passes
        # weighs as much as any after it, and ``max`` would keep it. Others are sampled.
        enough = 1 if self._best_first(req) else self.sample
        for host in self._candidates(req):
            visited += 1
            failed = next((name for name, f in filters.items() if not f(host, req)), None)
            if failed is not None:
                rejected[failed] += 1
                continue
            feasible.append(host)
            if len(feasible) >= enough:
                break
        if not feasible:
            if req.gpus:  # hosts the GPU index never offered lacked the GPUs
                rejected["gpu"] += len(self.hosts) - visited
            raise NoValidHost(req, len(self.hosts), rejected, self.excluded)
        best = max(feasible, key=lambda host: tuple(w(host, req) for w in WEIGHERS))
        cell = _pick_cell(best, req.gpus) if req.gpus else None
        if req.gpus == 0:
            devices: tuple[int, ...] = ()
        elif cell is None:
            devices = tuple(
                itertools.islice(
                    (d for c in sorted(best.cells) for d in sorted(best.cells[c])), req.gpus
                )
            )
        else:
            devices = tuple(sorted(best.cells[cell])[: req.gpus])
        return Placement(best.id, best.name, cell if req.gpus else None, devices, best.rack)

    @staticmethod
    def _best_first(req: Request) -> bool:
        """Whether ``_candidates`` offers the hosts for ``req`` in the weighers' order."""
        return bool(req.gpus) and not (req.group_policy == "affinity" and req.group_hosts)

    def _candidates(self, req: Request) -> Iterator[HostView]:
        if req.group_policy == "affinity" and req.group_hosts:
            yield from (self.hosts[h] for h in req.group_hosts if h in self.hosts)
            return
        if req.gpus:
            yield from self._gpu_candidates(req)
            return
        order = self._cpu_order.items
        count = len(order)
        if not count:
            return
        start = next(self._start) % count
        gpu_hosts = []
        for i in range(start, start + count):
            host = self.hosts[order[i % count]]
            if host.gpus_total:
                gpu_hosts.append(host)
            else:
                yield host
        yield from gpu_hosts

    def _gpu_candidates(self, req: Request) -> Iterator[HostView]:
        """Hosts with a cell (or a whole node) that fits ``req``, tightest pattern first
        (pinned hosts first of each pattern; for an on-demand VM that takes part of a node,
        pinned hosts first of all): the order of ``pack_gpus_weigher``, which weighs alike
        every host of one pattern and pinning and prefers the pattern ``_pack_order`` puts
        first."""
        keyed = []
        pinned_first = req.on_demand and req.gpus <= 4
        for key, ids in self._gpu_index.items():
            model, pattern, pinned = key
            if not ids or (req.gpu_model and model != req.gpu_model):
                continue
            order = _pack_order(pattern, req.gpus)
            if order is not None:
                rank = (not pinned, order) if pinned_first else (order, not pinned)
                keyed.append((rank, key))
        for _rank, key in sorted(keyed):
            ids = self._gpu_index[key].items
            count = len(ids)
            start = self._rng.randrange(count)  # equally tight: spread concurrent schedulers
            for i in range(start, start + count):  # lazily: a decision reads a few
                yield self.hosts[ids[i % count]]
