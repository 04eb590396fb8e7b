"""Spot preemption decisions: which spot VMs to evict so an on-demand request fits.

No database and no clock here (``compute.services.spot`` loads the inputs, says what time it
is, and acts on the answer), as ``compute.scheduler`` decides placement in memory.

The rule, for one request:

* Only the candidates given can be victims. The caller gives spot VMs only (running or
  stopped, no action in flight), never an on-demand VM, and leaves out the spot VMs a
  project's guaranteed minimum protects.
* Victims all come from one host, which then fits the request as placement requires it:
  1-4 GPUs from one NUMA cell, more take the whole node, the vCPUs and memory free, the
  RDMA virtual functions its ports need free, the GPU model and the placement group's
  policy honoured.
* Of every such set the best, for a request that takes part of a node, is on a host already
  pinned (``HostView.pinned``: a GPU held by an on-demand VM or a lease, which no eviction
  frees), so on-demand work gathers on fewer hosts and a whole-node on-demand request still
  finds a host that evictions can empty; then it **wastes the fewest GPU-seconds**: each
  victim's GPUs times the work it would lose (``now`` less its ``started``, the moment
  since which its work is unsaved: its last start or its guest's last reported checkpoint;
  when its guest is expected to save during its notice, one reported interval after its
  last save, only the work after that save, which the stop at the notice's end loses)
  plus ``cost_s``, what every evicted GPU costs beyond that (the rest of its notice, its
  stop, its boot when started again: ``KUMO_SPOT_EVICTION_COST_S``). A stopped VM wastes
  nothing (``NOTHING_TO_LOSE``). A guest expected to save a little after its notice would
  end, within ``stretch_s`` (``KUMO_SPOT_NOTICE_STRETCH_S``), gets a notice that lasts until
  5 s after that save: it loses those 5 s, and every running victim of the set is stopped
  at the latest deadline (``Preemption.deadline``), so the GPUs of those whose own notice
  ended sooner, and for the added time the free GPUs the request takes, wait idle, which
  counts in the waste. Then it has the fewest VMs, then frees the fewest GPUs.
  So two VMs that have just saved their work go before one that would lose twenty
  minutes; a larger ``cost_s`` weighs the GPUs freed beyond the request more against the
  work saved. vCPUs and memory short after the GPUs are freed are covered
  by the largest CPU-only candidates of the host, greedily (they hold no GPU: they add to
  the count, not to the waste).

Speed: a host's candidates are few (at most one per GPU plus its CPU-only VMs), so a host
costs a handful of combinations, and few hosts are searched at all. Every host gets a
first key no set on it can beat, from its candidates in one pass: nothing wasted if its
free GPUs could do, the exact waste of emptying it for a whole node, else the waste of the
GPUs its fullest cell lacks, taken from the candidates that waste least per GPU whatever
their cells. Hosts are taken
in that order until the next one's is worse than the best set found. On a full fleet the
first host's key is its best set's, and the search stops after it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from compute.scheduler import GROUP_FILTERS, HostView, Request

# The ``started`` of a candidate with no work to lose (a stopped VM): later than any real
# moment (the year 33658), yet finite.
NOTHING_TO_LOSE = 1e12
# A save expected this close to the notice's end is not counted on: it may come too late.
SAVE_MARGIN_S = 5.0


@dataclass(frozen=True)
class Candidate:
    """A spot VM that may be evicted. ``cell``: the NUMA cell of its GPUs (``None`` for a
    whole-node VM, or one without GPUs). ``started``: since when its work is unsaved, what
    an eviction would lose (seconds since 1970; ``NOTHING_TO_LOSE`` for a stopped VM)."""

    vm_id: str
    host_id: int
    gpus: int
    vcpus: int
    memory_mib: int
    started: float
    cell: int | None = None
    # When its guest is expected to save next (seconds since 1970; ``None`` when it never
    # reported a save), and the notice an eviction would give it.
    saves_at: float | None = None
    notice_s: float = 0.0
    # The RDMA virtual functions its ports hold on the host: an eviction frees them.
    rdma_vfs: int = 0


@dataclass(frozen=True)
class Preemption:
    """The decision: evict ``victims`` (VM ids) on ``host_id``; the request then fits there."""

    host_id: int
    host_name: str
    victims: tuple[str, ...]
    gpus_freed: int = 0
    # When the running victims are stopped (seconds since 1970): the latest of their
    # notices' ends, or of the saves waited for.
    deadline: float = 0.0


@dataclass(frozen=True)
class _Cost:
    """What evicting a candidate wastes per GPU, at ``now`` (seconds since 1970), and when
    its guest is stopped: at its notice's end, or, when its guest is expected to save a
    little after that (within ``stretch_s``), just after that save."""

    now: float
    cost_s: float
    stretch_s: float = 0.0

    def deadline(self, cand: Candidate) -> float:
        """When ``cand``'s guest is stopped if evicted now (seconds since 1970)."""
        if cand.started >= NOTHING_TO_LOSE:
            return self.now  # stopped: nothing to give notice to
        end = self.now + cand.notice_s
        saves_at = cand.saves_at
        if (
            saves_at is not None
            and cand.notice_s > 0  # a template without notice gets none
            and end < saves_at + SAVE_MARGIN_S <= end + self.stretch_s
        ):
            return saves_at + SAVE_MARGIN_S  # waits for the save due just after the notice
        return end

    def per_gpu(self, cand: Candidate, deadline: float | None = None) -> float:
        """``deadline``: ``self.deadline(cand)``, when the caller has it already."""
        if cand.started >= NOTHING_TO_LOSE:
            return 0.0  # stopped: no work lost, and no guest to stop and boot again
        saves_at = cand.saves_at
        if saves_at is not None and self.now < saves_at:
            if deadline is None:
                deadline = self.deadline(cand)
            if saves_at <= deadline - SAVE_MARGIN_S:
                # It saves before it is stopped: the stop loses only what follows the
                # save, not the work since ``started``; a notice made longer for the save
                # costs what the guest does after it.
                stretched = deadline - (self.now + cand.notice_s)
                return max(0.0, self.cost_s - (saves_at - self.now) + stretched)
        return max(0.0, self.now - cand.started) + self.cost_s

    def key(self, victims: Sequence[Candidate], spoils: int, idle: int = 0) -> tuple:
        """``idle``: the GPUs free now that the request takes beside the victims'."""
        deadlines = [self.deadline(v) for v in victims]
        last = max(deadlines, default=self.now)
        ends = [self.now + v.notice_s for v in victims if v.started < NOTHING_TO_LOSE]
        return (
            spoils,
            # Every running victim is stopped at the last one's deadline: the GPUs of
            # those whose notice alone would have ended sooner wait for it, and so do,
            # for as long as a notice was made longer, the free GPUs the request takes,
            # which no one else may take meanwhile.
            sum(
                v.gpus * (self.per_gpu(v, d) + (last - d if v.started < NOTHING_TO_LOSE else 0.0))
                for v, d in zip(victims, deadlines, strict=True)
            )
            + idle * (last - max(ends, default=last)),
            len(victims),
            sum(v.gpus for v in victims),
        )


NONE_FOUND = (math.inf,)


def _spoils(host: HostView, req: Request) -> int:
    """1 when evicting on ``host`` for ``req`` would spoil a host that a whole-node request
    could still have by eviction (not ``HostView.pinned``, placement's own notion), else 0.
    A pinned host is taken first: on-demand work gathers on fewer hosts, and a whole-node
    on-demand request still finds a host that evictions can empty."""
    if not req.gpus or _whole_node(host, req):
        return 0
    return int(not host.pinned)


def _whole_node(host: HostView, req: Request) -> bool:
    return req.gpus > max(host.cell_sizes.values(), default=0)


def _add_cpu(
    host: HostView, req: Request, chosen: tuple[Candidate, ...], cpu_only: Sequence[Candidate]
) -> tuple[Candidate, ...] | None:
    """``chosen`` plus the fewest CPU-only candidates (largest first) that make the vCPUs
    and memory fit; ``None`` when even all of them do not, or when the set does not free
    the RDMA virtual functions the request needs beyond the host's free ones."""
    vcpus = host.vcpus_free + sum(v.vcpus for v in chosen)
    memory = host.memory_mib_free + sum(v.memory_mib for v in chosen)
    extra = []
    for cand in cpu_only:
        if vcpus >= req.vcpus and memory >= req.memory_mib:
            break
        extra.append(cand)
        vcpus += cand.vcpus
        memory += cand.memory_mib
    if vcpus < req.vcpus or memory < req.memory_mib:
        return None
    victims = chosen + tuple(extra)
    if req.rdma_vfs and host.vfs_free + sum(v.rdma_vfs for v in victims) < req.rdma_vfs:
        return None
    return victims


def _on_host(
    host: HostView,
    cands: Sequence[Candidate],
    req: Request,
    cost: _Cost,
    best_key: tuple,
    spoils: int = 0,
) -> tuple[tuple, tuple[Candidate, ...]] | None:
    """The best victim set on ``host`` whose key is below ``best_key``, with its key, or
    ``None``."""
    if req.gpus and req.gpu_model and host.gpu_model != req.gpu_model:
        return None
    if not all(check(host, req) for check in GROUP_FILTERS):
        return None
    cpu_only = sorted(
        (c for c in cands if not c.gpus), key=lambda c: (-c.vcpus, -c.memory_mib, -c.started)
    )
    if not req.gpus:
        victims = _add_cpu(host, req, (), cpu_only)
        return None if victims is None else (cost.key(victims, spoils), victims)
    with_gpus = [c for c in cands if c.gpus]
    free = {cell: len(ids) for cell, ids in host.cells.items()}
    if _whole_node(host, req):
        # A whole node: every GPU of the host must be free, so every holder goes.
        if sum(free.values()) + sum(c.gpus for c in with_gpus) < host.gpus_total:
            return None  # a GPU is held by a VM that is not a candidate
        victims = _add_cpu(host, req, tuple(with_gpus), cpu_only)
        idle = sum(free.values())
        if victims is None or (key := cost.key(victims, spoils, idle)) >= best_key:
            return None
        return key, victims
    found: tuple[tuple, tuple[Candidate, ...]] | None = None
    found_key = best_key
    for cell, size in host.cell_sizes.items():
        if size < req.gpus:
            continue
        need = req.gpus - free.get(cell, 0)
        if need <= 0:
            options: Iterable[tuple[Candidate, ...]] = [()]
        else:
            # A whole-node VM frees its GPUs in this cell too: it counts as the cell's size
            # towards the need, and as all its GPUs in the waste. Every covering set is
            # weighed (a cell holds a few VMs), so a larger one that also frees the vCPUs
            # short is found too.
            in_cell = [c for c in with_gpus if c.cell == cell or c.cell is None]
            counted = {c.vm_id: (size if c.cell is None else c.gpus) for c in in_cell}
            if sum(counted.values()) < need:
                continue
            options = (
                combo
                for k in range(1, len(in_cell) + 1)
                for combo in itertools.combinations(in_cell, k)
                if sum(counted[c.vm_id] for c in combo) >= need
            )
        idle = min(free.get(cell, 0), req.gpus)
        for combo in options:
            victims = _add_cpu(host, req, combo, cpu_only)
            if victims is not None and (key := cost.key(victims, spoils, idle)) < found_key:
                found, found_key = (key, victims), key
    return found


def _first_key(
    host: HostView, cands: Sequence[Candidate], req: Request, cost: _Cost, spoils: int
) -> tuple | None:
    """The cheapest key no set on ``host`` can beat, for ordering every host, in one pass
    over its candidates; ``None`` when no set on it can make room for a whole node."""
    if req.gpus:
        room = sum(map(len, host.cells.values())) >= req.gpus
    else:
        room = host.vcpus_free >= req.vcpus and host.memory_mib_free >= req.memory_mib
    if room or not req.gpus:
        return (spoils, 0.0, int(not room), 0)  # CPU-only victims waste no GPU-second
    if _whole_node(host, req):
        held = sum(c.gpus for c in cands)
        if sum(map(len, host.cells.values())) + held < host.gpus_total:
            return None  # a GPU is held by a VM that is not a candidate
        # Without the free GPUs' wait, which the set's CPU-only victims may shorten: a
        # bound no set beats.
        with_gpus = [c for c in cands if c.gpus]
        return (spoils, *cost.key(with_gpus, spoils)[1:])
    # The GPUs its fullest cell lacks, taken from the candidates that waste least per GPU
    # (those about to save, then those unsaved since the latest), the last one in part,
    # whatever their cells: no set that frees them in one cell wastes less.
    need = req.gpus - max(map(len, host.cells.values()), default=0)
    left, least = need, 0.0
    wastes = sorted((cost.per_gpu(c), i) for i, c in enumerate(cands) if c.gpus)
    for waste, i in wastes:
        taken = min(left, cands[i].gpus)
        least += taken * waste
        left -= taken
        if not left:
            return (spoils, least, 1, need)
    return None  # its candidates hold too few GPUs


def choose_victims(
    hosts: Iterable[HostView],
    candidates: Mapping[int, Sequence[Candidate]],
    req: Request,
    *,
    now: float,
    cost_s: float,
    stretch_s: float = 0.0,
) -> Preemption | None:
    """The best preemption for ``req`` over ``hosts`` at ``now`` (see the module's rule), or
    ``None`` when evicting candidates cannot make it fit anywhere. ``candidates`` maps a
    host id to its evictable VMs; hosts without candidates are passed over (the request
    does not fit there, or placement would have found them)."""
    cost = _Cost(now, cost_s, stretch_s)
    best_key, best_host, best_victims = NONE_FOUND, None, ()
    staged = []
    for host in hosts:
        cands = candidates.get(host.id)
        if cands:
            spoils = _spoils(host, req)
            first = _first_key(host, cands, req, cost, spoils)
            if first is not None:
                staged.append((first, host.id, host, cands, spoils))
    staged.sort(key=lambda item: (item[0], item[1]))
    for first, _id, host, cands, spoils in staged:
        if first >= best_key:
            break  # no set on this host or any after it beats the best one
        found = _on_host(host, cands, req, cost, best_key, spoils)
        if found is not None and found[1]:
            (best_key, best_victims), best_host = found, host
    if best_host is None:
        return None
    return Preemption(
        host_id=best_host.id,
        host_name=best_host.name,
        victims=tuple(v.vm_id for v in best_victims),
        gpus_freed=sum(v.gpus for v in best_victims),
        deadline=max(map(cost.deadline, best_victims), default=now),
    )
