"""Spot preemption decisions: which spot VMs to evict so an on-demand request fits.

No database here (``compute.services.spot`` loads the inputs and acts on the answer), as
``compute.scheduler`` decides placement in memory.

The rule, for one request:

* Only the candidates given can be victims. The caller gives spot VMs only (running or
  stopped, no action in flight), never an on-demand VM, and leaves out the spot VMs a
  project's guaranteed minimum protects.
* Victims all come from one host, which then fits the request as placement requires it:
  1-4 GPUs from one NUMA cell, more take the whole node, the vCPUs and memory free, the GPU
  model and the placement group's policy honoured.
* Of every such set the best has the fewest VMs, then, for a request that takes part of
  a node, is on a host already pinned (``HostView.pinned``: a GPU held by an on-demand VM
  or a lease, which no eviction frees), so on-demand work gathers on fewer hosts and a
  whole-node on-demand request still finds a host that evictions can empty, then frees the
  fewest GPUs (GPUs freed beyond the request's often fit no waiting request, and sit idle),
  then loses the least work: the largest sum of ``started``, each victim's moment since
  which its work is unsaved (its last start or its guest's last reported checkpoint;
  ``NOTHING_TO_LOSE`` for a stopped VM). The count is exact: within one cell, the fewest
  VMs that free ``need`` GPUs are the largest first, and every set of that size is then
  compared by GPUs freed and ``started``. vCPUs and memory short after the GPUs are freed
  are covered by the largest CPU-only candidates of the host, greedily.

Speed: a host's candidates are few (at most one per GPU plus its CPU-only VMs), so a host
costs a sort and a handful of combinations, and few hosts are searched at all. Every host
gets a first key no set on it can beat, as cheap as can be (no victim if its free GPUs
could do, else one, freeing at least what the request lacks there, with the latest
``started`` of its candidates); hosts are taken in that order until the next one's is worse
than the best set found, and each is searched only if its tighter key (its lower bound on
the count, the fewest GPUs freed, the latest ``started`` that many of its candidates could
have) could still beat the best. When one victim does, as on a full fleet, the search stops
after the host of the candidate that suffices, frees least and loses least.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from compute.scheduler import GROUP_FILTERS, HostView, Request

# The ``started`` of a candidate with no work to lose (a stopped VM): later than any real
# moment (the year 33658), yet finite, so that sets holding one still compare by the rest.
NOTHING_TO_LOSE = 1e12


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


@dataclass(frozen=True)
class Preemption:
    """The decision: evict ``victims`` (VM ids) on ``host_id``; the request then fits there."""

    host_id: int
    host_name: str
    victims: tuple[str, ...]
    gpus_freed: int = 0


@dataclass
class _Best:
    key: tuple = field(default=(math.inf,))
    host: HostView | None = None
    victims: tuple[Candidate, ...] = ()

    @property
    def count(self) -> float:
        return self.key[0]


def _key(victims: Sequence[Candidate], spoils: int) -> tuple:
    return (len(victims), spoils, sum(v.gpus for v in victims), -sum(v.started for v in victims))


def _fewest_freed(host: HostView, req: Request) -> int:
    """The fewest GPUs any victim set on ``host`` frees for ``req`` (a lower bound): a whole
    node frees every GPU held, part of one at least what its fullest cell lacks."""
    if not req.gpus:
        return 0
    free = [len(ids) for ids in host.cells.values()] or [0]
    if req.gpus > max(host.cell_sizes.values(), default=0):
        return sum(host.cell_sizes.values()) - sum(free)
    return max(0, req.gpus - max(free))


def _spoils(host: HostView, req: Request) -> int:
    """1 when evicting on ``host`` for ``req`` would spoil a host that a whole-node request
    could still have by eviction (not ``HostView.pinned``, placement's own notion), else 0.
    Of equally few victims, a pinned host is taken first: on-demand work gathers on fewer
    hosts, and a whole-node on-demand request still finds a host that evictions can empty."""
    if not req.gpus or req.gpus > max(host.cell_sizes.values(), default=0):
        return 0
    return int(not host.pinned)


def _fewest_covering(cands: Sequence[Candidate], need: int) -> int | None:
    """How many of ``cands`` at least cover ``need`` GPUs (largest first is optimal)."""
    total, count = 0, 0
    for cand in sorted(cands, key=lambda c: -c.gpus):
        if total >= need:
            break
        total += cand.gpus
        count += 1
    return count if total >= need else None


def _add_cpu(
    host: HostView, req: Request, chosen: tuple[Candidate, ...], cpu_only: Sequence[Candidate]
) -> tuple[Candidate, ...] | None:
    """``chosen`` plus the fewest CPU-only candidates (largest first) that make the vCPUs
    and memory fit; ``None`` when even all of them do not."""
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
    return chosen + tuple(extra)


def _on_host(
    host: HostView, cands: Sequence[Candidate], req: Request, best: _Best, spoils: int = 0
) -> tuple[Candidate, ...] | None:
    """The best victim set on ``host`` no larger than ``best``'s, or ``None``."""
    if req.gpus and req.gpu_model and host.gpu_model != req.gpu_model:
        return None
    if not all(check(host, req) for check in GROUP_FILTERS):
        return None
    cpu_only = sorted(
        (c for c in cands if not c.gpus), key=lambda c: (-c.vcpus, -c.memory_mib, -c.started)
    )
    if not req.gpus:
        return _add_cpu(host, req, (), cpu_only)
    with_gpus = [c for c in cands if c.gpus]
    free = {cell: len(ids) for cell, ids in host.cells.items()}
    if req.gpus > max(host.cell_sizes.values(), default=0):
        # A whole node: every GPU of the host must be free, so every holder goes.
        if sum(free.values()) + sum(c.gpus for c in with_gpus) < host.gpus_total:
            return None  # a GPU is held by a VM that is not a candidate
        if len(with_gpus) > best.count:
            return None
        return _add_cpu(host, req, tuple(with_gpus), cpu_only)
    found: tuple[Candidate, ...] | None = None
    found_key: tuple = best.key
    for cell, size in host.cell_sizes.items():
        if size < req.gpus:
            continue
        need = req.gpus - free.get(cell, 0)
        if need <= 0:
            options: Iterable[tuple[Candidate, ...]] = [()]
        else:
            # A whole-node VM frees its GPUs in this cell too.
            in_cell = [
                replace_gpus(c, size) if c.cell is None else c
                for c in with_gpus
                if c.cell == cell or c.cell is None
            ]
            k = _fewest_covering(in_cell, need)
            if k is None or k > found_key[0]:
                continue
            options = (
                combo
                for combo in itertools.combinations(in_cell, k)
                if sum(c.gpus for c in combo) >= need
            )
        for combo in options:
            original = tuple(_original(c, with_gpus) for c in combo)
            victims = _add_cpu(host, req, original, cpu_only)
            if victims is not None and _key(victims, spoils) < found_key:
                found, found_key = victims, _key(victims, spoils)
    return found


def replace_gpus(cand: Candidate, gpus: int) -> Candidate:
    """``cand`` as seen from one cell: a whole-node VM frees that cell's GPUs."""
    return Candidate(
        cand.vm_id, cand.host_id, gpus, cand.vcpus, cand.memory_mib, cand.started, cand.cell
    )


def _original(cand: Candidate, with_gpus: Sequence[Candidate]) -> Candidate:
    if cand.cell is not None:
        return cand
    return next(c for c in with_gpus if c.vm_id == cand.vm_id)


def lower_bound(host: HostView, cands: Sequence[Candidate], req: Request) -> float:
    """The fewest victims any set on ``host`` could have (``inf`` when none could do).
    Called for every host with candidates: one pass, no intermediate lists."""
    if not req.gpus:
        fits = host.vcpus_free >= req.vcpus and host.memory_mib_free >= req.memory_mib
        return 0 if fits else 1 if cands else math.inf
    count = held = biggest = 0
    for cand in cands:
        gpus = cand.gpus
        if gpus:
            count += 1
            held += gpus
            if gpus > biggest:
                biggest = gpus
    sizes = host.cell_sizes.values()
    if req.gpus > (max(sizes) if sizes else 0):
        if sum(map(len, host.cells.values())) + held < sum(sizes):
            return math.inf  # a GPU is held by a VM that is not a candidate
        return count
    free = max(map(len, host.cells.values())) if host.cells else 0
    if free >= req.gpus:
        return 0
    return math.ceil((req.gpus - free) / biggest) if biggest else math.inf


def _first_key(host: HostView, cands: Sequence[Candidate], req: Request, spoils: int) -> tuple:
    """The cheapest key no set on ``host`` can beat, for ordering every host: none needed
    if its free GPUs (or, for a CPU request, its room) could do, else one at least, with
    the latest ``started`` of its candidates. No higher than ``optimistic_key``."""
    if req.gpus:
        room = sum(map(len, host.cells.values())) >= req.gpus
    else:
        room = host.vcpus_free >= req.vcpus and host.memory_mib_free >= req.memory_mib
    if room:
        return (0, spoils, 0, 0)
    return (1, spoils, _fewest_freed(host, req), -max([c.started for c in cands]))


def optimistic_key(bound: float, cands: Sequence[Candidate], spoils: int, freed: int = 0) -> tuple:
    """A key no victim set of ``bound`` or more of ``cands`` can beat: ``bound`` VMs, with
    the ``bound`` latest ``started`` of its candidates."""
    if not bound:
        return (0, spoils, 0, 0)
    if bound == 1:
        return (1, spoils, freed, -max([c.started for c in cands]))
    return (bound, spoils, freed, -sum(heapq.nlargest(int(bound), [c.started for c in cands])))


def choose_victims(
    hosts: Iterable[HostView],
    candidates: Mapping[int, Sequence[Candidate]],
    req: Request,
) -> Preemption | None:
    """The best preemption for ``req`` over ``hosts`` (see the module's rule), or ``None``
    when evicting candidates cannot make it fit anywhere. ``candidates`` maps a host id to
    its evictable VMs; hosts without candidates are passed over (the request does not fit
    there, or placement would have found them)."""
    best = _Best()
    staged = []
    for host in hosts:
        cands = candidates.get(host.id)
        if cands:
            spoils = _spoils(host, req)
            staged.append((_first_key(host, cands, req, spoils), host.id, host, cands, spoils))
    staged.sort(key=lambda item: (item[0], item[1]))
    for first, _id, host, cands, spoils in staged:
        if first > best.key:
            break  # no set on this host or any after it beats the best one
        bound = lower_bound(host, cands, req)
        if bound == math.inf:
            continue
        if optimistic_key(bound, cands, spoils, _fewest_freed(host, req)) > best.key:
            continue
        victims = _on_host(host, cands, req, best, spoils)
        if victims and _key(victims, spoils) < best.key:
            best = _Best(_key(victims, spoils), host, victims)
    if best.host is None:
        return None
    return Preemption(
        host_id=best.host.id,
        host_name=best.host.name,
        victims=tuple(v.vm_id for v in best.victims),
        gpus_freed=sum(v.gpus for v in best.victims),
    )
