"""Guaranteed minimums hold capacity (mdx's Rmin), as placement and operators see them.

A project's guarantee (``CapacityGuarantee``: ``min_gpus`` of ``gpu_model``, and
``min_vcpus``) is capacity the project gets whenever it asks. What that means here:

- **Headroom.** A project's headroom is its minimum less what its own on-demand VMs hold
  (never below 0). Other projects' on-demand VMs never take it: an on-demand request of
  project P for ``g`` GPUs of model M is admitted only if

      on-demand GPUs of M held by everyone + g + headroom of every other project on M
      <= GPUs of M on hosts that are up

  (the same for vCPUs against the vCPUs of the hosts that are up). Spot VMs do not count:
  they may run in the headroom, and the guaranteed project's on-demand request evicts them
  with their full notice (``compute.services.spot.preempt_for``), as it evicts any spot VM.
  ``admission_refusal`` is asked by ``compute.placement.place`` and by ``preempt_for``, so
  a refused request neither takes free GPUs nor evicts anyone for them: it waits.
- **Never over-promised.** ``guarantee_set`` refuses (409, saying by how much) a minimum
  that makes the sum of the minimums of a model exceed that model's GPUs in the fleet
  (every host that is not down: draining and maintenance hosts come back), or the sum of
  vCPU minimums exceed the fleet's vCPUs. On PostgreSQL it holds a transaction advisory
  lock, so two concurrent settings are decided one after the other.
- **Broken by a host.** A host going down or into maintenance can leave the hosts that
  are up with fewer GPUs of a model than the minimums promise: ``guarantees_check`` (after
  every host state change) records an audit event ``capacity.guarantee_at_risk`` for
  operators and tells each guaranteed project of that model (an event), once per change.

Concurrency: admissions of one GPU model are serialised by a transaction advisory lock on
PostgreSQL, taken only while some guarantee of that model exists (the fleet without
guarantees places as fast as before). On SQLite writers are serialised anyway.
"""

from __future__ import annotations

import logging
import zlib
from datetime import datetime
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from compute import leases
from compute.choices import DeviceKind, HostState, Priority, VmState
from compute.models import CapacityGuarantee, Device, Host, Lease, VirtualMachine
from controlplane import audit, events
from controlplane.compiled import Compiled
from controlplane.errors import Conflict, InvalidInput

log = logging.getLogger(__name__)

# States in which an on-demand VM holds (or is about to hold) its GPUs and vCPUs.
HOLDING = [
    VmState.PROVISIONING,
    VmState.RUNNING,
    VmState.STOPPED,
    VmState.ERROR,
    VmState.SHELVING,
]
_SET_LOCK = "kumo.guarantee.set"


def _advisory_lock(name: str) -> None:
    """A transaction-scoped lock on ``name`` (PostgreSQL); nothing elsewhere (SQLite
    serialises writers)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [zlib.crc32(name.encode())])


# --- the fleet ---------------------------------------------------------------------------------


def fleet_gpus(*, up_only: bool) -> dict[str, int]:
    """GPUs present per model on hosts that are up (``up_only``) or not down."""
    return dict(_FLEET_GPUS[up_only].tuples())


def _fleet_gpus(up_only: bool):
    hosts = (
        Host.objects.filter(state=HostState.UP)
        if up_only
        else Host.objects.exclude(state=HostState.DOWN)
    )
    # Counted by the database: every admission weighed asks it, and a fleet of 1,000 GPU
    # hosts has 8,000 rows to count.
    return (
        Device.objects.filter(kind=DeviceKind.GPU, present=True, host__in=hosts)
        .values("model")
        .annotate(n=Count("pk"))
        .values_list("model", "n")
        .order_by()
    )


# Every admission weighed reads these: compiled once (``controlplane.compiled``).
_FLEET_GPUS = {up: Compiled(lambda up=up: _fleet_gpus(up)) for up in (False, True)}
_GPU_MINIMUMS = Compiled(
    lambda model: CapacityGuarantee.objects.filter(min_gpus__gt=0, gpu_model=model).values_list(
        "project_id", "min_gpus"
    ),
    str,
)
_VCPU_MINIMUMS = Compiled(
    lambda: CapacityGuarantee.objects.filter(min_vcpus__gt=0).values_list("project_id", "min_vcpus")
)
_ON_DEMAND_GPUS = Compiled(
    lambda model, vm_id: _on_demand_rows("gpus", Q(gpu_model=model, gpus__gt=0), vm_id), str, UUID
)


def fleet_vcpus(*, up_only: bool) -> int:
    hosts = (
        Host.objects.filter(state=HostState.UP)
        if up_only
        else Host.objects.exclude(state=HostState.DOWN)
    )
    return sum(h.vcpus_capacity for h in hosts.only("vcpus", "cpu_allocation_ratio"))


# --- setting -----------------------------------------------------------------------------------


def guarantee_set(
    *, project, min_gpus: int, gpu_model: str = "", min_vcpus: int = 0, actor=None
) -> CapacityGuarantee:
    """Set ``project``'s guaranteed minimum (operators); all zero removes it. ``gpu_model``
    may be left empty when the fleet has one GPU model. Refused with 409 when the minimums
    of that model (or of vCPUs) would add up to more than the fleet holds."""
    if min_gpus < 0 or min_vcpus < 0:
        raise InvalidInput.field("min_gpus", "must be 0 or more")
    with transaction.atomic():
        _advisory_lock(_SET_LOCK)
        fleet = fleet_gpus(up_only=False)
        if min_gpus and not gpu_model:
            if len(fleet) != 1:
                raise InvalidInput.field(
                    "gpu_model", f"name one of the fleet's GPU models: {', '.join(sorted(fleet))}"
                )
            gpu_model = next(iter(fleet))
        others = CapacityGuarantee.objects.exclude(project=project)
        if min_gpus:
            promised = (
                others.filter(gpu_model=gpu_model).aggregate(n=Sum("min_gpus"))["n"] or 0
            ) + min_gpus
            promised += leased_peak(gpu_model, timezone.now())
            have = fleet.get(gpu_model, 0)
            if promised > have:
                raise Conflict(
                    f"guaranteed minimums and reservations of {gpu_model} would add up to "
                    f"{promised} GPUs; the fleet has {have}: {promised - have} too many",
                    code="over_promised",
                    details={"min_gpus": [f"exceeds the fleet by {promised - have}"]},
                )
        if min_vcpus:
            promised = (others.aggregate(n=Sum("min_vcpus"))["n"] or 0) + min_vcpus
            have = fleet_vcpus(up_only=False)
            if promised > have:
                raise Conflict(
                    f"guaranteed vCPU minimums would add up to {promised}; the fleet has "
                    f"{have}: {promised - have} too many",
                    code="over_promised",
                    details={"min_vcpus": [f"exceeds the fleet by {promised - have}"]},
                )
        current = CapacityGuarantee.objects.select_for_update().filter(project=project).first()
        before = (
            {
                "min_gpus": current.min_gpus,
                "gpu_model": current.gpu_model,
                "min_vcpus": current.min_vcpus,
            }
            if current
            else {"min_gpus": 0, "gpu_model": "", "min_vcpus": 0}
        )
        after = {
            "min_gpus": min_gpus,
            "gpu_model": gpu_model if min_gpus else "",
            "min_vcpus": min_vcpus,
        }
        if current is None:
            current = CapacityGuarantee(project=project)
        for name, value in after.items():
            setattr(current, name, value)
        current.save()
        if before != after:
            audit.record(
                "capacity_guarantee.update",
                current,
                project=project,
                detail={
                    k: {"from": before[k], "to": after[k]} for k in after if before[k] != after[k]
                },
            )
        return current


# --- admission -----------------------------------------------------------------------------------


def _headroom(guarantees, used: dict[int, int], project_id: int | None) -> int:
    """The guaranteed GPUs (or vCPUs) of every project but ``project_id`` (None: of every
    project) that its on-demand VMs do not use."""
    return sum(
        max(0, minimum - used.get(pid, 0)) for pid, minimum in guarantees if pid != project_id
    )


def admission_refusal(vm: VirtualMachine, *, to_weigh: bool = False) -> str:
    """Why ``vm`` (an on-demand request) may not take capacity now: other projects'
    guaranteed headroom would be taken; empty when it may. Spot VMs are always admitted
    (they only ever borrow the headroom). ``to_weigh``: the caller knows, or has reason to
    think, that there is something to weigh (a claim just said so), and the question
    whether there is (``_anything_to_check``, which only saves the reads below when there
    is not) is not asked; the answer is the same."""
    if vm.priority != Priority.ON_DEMAND or vm.lease_id is not None:
        return ""  # a VM in a lease runs on the lease's own GPUs
    if not to_weigh and not _anything_to_check(vm):
        return ""
    if vm.gpus:
        guarantees = _GPU_MINIMUMS.tuples(vm.gpu_model)
        others = any(pid != vm.project_id for pid, _ in guarantees)
        leased = leased_peak(vm.gpu_model, timezone.now())
        if others or leased:
            _advisory_lock(f"kumo.guarantee.gpu.{vm.gpu_model}")
            used = {pid: n or 0 for pid, n in _ON_DEMAND_GPUS.tuples(vm.gpu_model, vm.pk)}
            headroom = _headroom(guarantees, used, vm.project_id)
            total = fleet_gpus(up_only=True).get(vm.gpu_model, 0)
            taken = sum(used.values())
            if taken + vm.gpus + headroom + leased > total:
                held = [f"reserved by leases ({leased} GPUs)"] if leased else []
                if headroom or not held:
                    held.insert(0, f"guaranteed to other projects ({headroom} GPUs of headroom)")
                return (
                    f"the free {vm.gpu_model} GPUs are {' and '.join(held)}; waiting for capacity"
                )
    guarantees = _VCPU_MINIMUMS.tuples()
    if guarantees and any(pid != vm.project_id for pid, _ in guarantees):
        _advisory_lock("kumo.guarantee.vcpu")
        used = _on_demand_use("vcpus", Q(), exclude=vm)
        headroom = _headroom(guarantees, used, vm.project_id)
        if sum(used.values()) + vm.vcpus + headroom > fleet_vcpus(up_only=True):
            return (
                f"the free vCPUs are guaranteed to other projects ({headroom} vCPUs of "
                "headroom); waiting for capacity"
            )
    return ""


# ``nothing_to_weigh``'s condition. The lease states that hold capacity are constants of the
# code, written in it rather than sent as parameters with every claim.
_HOLDING = ", ".join(f"'{state.value}'" for state in leases.HOLDING)
_NOTHING_TO_WEIGH = f"""NOT EXISTS (
            SELECT 1 FROM {CapacityGuarantee._meta.db_table}
            WHERE project_id <> %(admission_project)s
              AND (min_vcpus > 0 OR (%(admission_gpus)s AND min_gpus > 0
                                     AND gpu_model = %(admission_model)s))
        ) AND NOT (%(admission_gpus)s AND EXISTS (
            SELECT 1 FROM {Lease._meta.db_table}
            WHERE gpu_model = %(admission_model)s AND state IN ({_HOLDING})
              AND ends_at > %(admission_now)s
        ))"""


def nothing_to_weigh(vm: VirtualMachine) -> tuple[str, dict] | None:
    """The SQL condition under which ``vm``'s admission has nothing to weigh, and its
    parameters (named ``admission_*``); None when ``vm`` is always admitted (spot, or in a
    lease). It holds when no other project has a guarantee of vCPUs or (for a GPU VM) of
    its GPU model and no lease holds that model now or later (a lease's peak from now is
    then 0): every request is then admitted, as ``admission_refusal`` would find. A claim
    puts it in its own statement (``compute.claims``), so the common case asks nothing
    more; where it does not hold, the caller asks ``admission_refusal``."""
    if vm.priority != Priority.ON_DEMAND or vm.lease_id is not None:
        return None
    params = {
        "admission_project": vm.project_id,
        "admission_gpus": bool(vm.gpus),
        "admission_model": vm.gpu_model,
        "admission_now": connection.ops.adapt_datetimefield_value(timezone.now()),
    }
    return _NOTHING_TO_WEIGH, params


def _anything_to_check(vm: VirtualMachine) -> bool:
    """Whether ``vm``'s admission has anything to weigh (``nothing_to_weigh``), in one
    query."""
    sql, params = nothing_to_weigh(vm)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql}", params)
        return not cursor.fetchone()[0]


def _on_demand_use(
    field: str, where: Q, *, exclude: VirtualMachine | None = None
) -> dict[int, int]:
    """Per project, what its on-demand VMs outside leases hold of ``field``."""
    rows = _on_demand_rows(field, where, exclude.pk if exclude else None)
    return {pid: n or 0 for pid, n in rows}


def _on_demand_rows(field: str, where: Q, exclude_pk):
    return (
        VirtualMachine.objects.filter(
            where, priority=Priority.ON_DEMAND, state__in=HOLDING, lease__isnull=True
        )
        .exclude(pk=exclude_pk)
        .values("project_id")
        .annotate(n=Sum(field))
        .values_list("project_id", "n")
        .order_by()
    )


# --- what is promised over time ------------------------------------------------------------


def peak(intervals, start, end=None) -> int:
    """The most GPUs that ``intervals`` ((start, end, gpus) each) hold at one instant of
    ``[start, end)`` (``end`` None: from ``start`` on)."""
    changes = []
    for s, e, n in intervals:
        s, e = max(s, start), (min(e, end) if end else e)
        if s < e:
            changes += [(s, n), (e, -n)]
    changes.sort(key=lambda change: change[0:2])  # at one instant, ends before starts
    held = most = 0
    for _, n in changes:
        held += n
        most = max(most, held)
    return most


def lease_intervals(model: str, start, end=None, *, exclude=None) -> list[tuple]:
    if end is None and exclude is None:
        return _LEASES_FROM.tuples(model, start)  # every admission weighed asks it
    return list(_lease_rows(model, start, end, exclude))


def _lease_rows(model: str, start, end=None, exclude=None):
    rows = Lease.objects.filter(gpu_model=model, state__in=leases.HOLDING, ends_at__gt=start)
    if end is not None:
        rows = rows.filter(starts_at__lt=end)
    if exclude is not None:
        rows = rows.exclude(pk=exclude.pk)
    return rows.values_list("starts_at", "ends_at", "gpus").order_by()


_LEASES_FROM = Compiled(lambda model, start: _lease_rows(model, start), str, datetime)


def leased_peak(model: str, start, end=None, *, exclude=None) -> int:
    """The most GPUs of ``model`` that leases hold at one instant of ``[start, end)``."""
    return peak(lease_intervals(model, start, end, exclude=exclude), start, end)


def committed(model: str) -> int:
    """GPUs of ``model`` promised now, for as long as anyone can tell: per project, the
    larger of its guaranteed minimum and what its on-demand VMs hold (they have no end)."""
    minimums = dict(
        CapacityGuarantee.objects.filter(gpu_model=model, min_gpus__gt=0).values_list(
            "project_id", "min_gpus"
        )
    )
    used = _on_demand_use("gpus", Q(gpu_model=model, gpus__gt=0))
    return sum(max(minimums.get(p, 0), used.get(p, 0)) for p in minimums.keys() | used.keys())


# --- a host leaving service ------------------------------------------------------------------


def guarantees_check(*, cause: str = "") -> list[str]:
    """Record an alert for each GPU model whose guaranteed minimums now exceed the GPUs of
    the hosts that are up (and for vCPUs); returns the models (``"vcpus"``) at risk.
    Call in the transaction of the host state change that may have broken them."""
    at_risk = []
    up = fleet_gpus(up_only=True)
    promised = (
        CapacityGuarantee.objects.filter(min_gpus__gt=0)
        .values("gpu_model")
        .annotate(n=Sum("min_gpus"))
        .values_list("gpu_model", "n")
        .order_by()
    )
    for model, total in promised:
        have = up.get(model, 0)
        if total > have:
            at_risk.append(model)
            _alert(
                model,
                total,
                have,
                cause,
                CapacityGuarantee.objects.filter(gpu_model=model, min_gpus__gt=0),
            )
    vcpus = CapacityGuarantee.objects.aggregate(n=Sum("min_vcpus"))["n"] or 0
    if vcpus:
        have = fleet_vcpus(up_only=True)
        if vcpus > have:
            at_risk.append("vcpus")
            _alert("vcpus", vcpus, have, cause, CapacityGuarantee.objects.filter(min_vcpus__gt=0))
    return at_risk


def _alert(what: str, promised: int, have: int, cause: str, guarantees) -> None:
    message = (
        f"guaranteed minimums of {what} add up to {promised}; hosts in service have {have}"
        + (f" ({cause})" if cause else "")
    )
    audit.record(
        "capacity.guarantee_at_risk",
        object_type="compute.capacityguarantee",
        object_id=what,
        object_repr=what,
        detail={"what": what, "promised": promised, "in_service": have, "cause": cause},
    )
    for guarantee in guarantees.select_related("project"):
        events.emit(
            "capacity.guarantee_at_risk",
            project=guarantee.project,
            message=f"your guaranteed minimum may not be met now: {message}",
            obj=guarantee,
            payload={"what": what, "promised": promised, "in_service": have},
        )
    log.warning("capacity guarantee at risk: %s", message)


# --- whole hosts: leases of whole hosts against on-demand VMs (``compute.services.leases``) ---


def gpus_per_host(model: str) -> int | None:
    """GPUs of ``model`` on each host that has them (hosts not down), when every such host
    has as many; None when they differ or no host has any."""
    counts = set(
        Device.objects.filter(kind=DeviceKind.GPU, model=model, present=True)
        .exclude(host__state=HostState.DOWN)
        .values("host_id")
        .annotate(n=Count("pk"))
        .values_list("n", flat=True)
        .order_by()
    )
    return counts.pop() if len(counts) == 1 else None


def hosts_taken(
    model: str, per_host: int, start: datetime, end: datetime | None, *, exclude=None
) -> tuple[int, bool]:
    """The most hosts of ``model`` that leases (but ``exclude``) take at one instant of
    ``[start, end)`` (``end`` None: from ``start`` on), and whether a lease of whole hosts
    is among them."""
    rows = Lease.objects.filter(gpu_model=model, state__in=leases.HOLDING, ends_at__gt=start)
    if end is not None:
        rows = rows.filter(starts_at__lt=end)
    if exclude is not None:
        rows = rows.exclude(pk=exclude.pk)
    rows = rows.values_list("starts_at", "ends_at", "gpus", "hosts")
    intervals, whole = [], False
    for s, e, gpus, hosts in rows.order_by():
        intervals.append((s, e, hosts or -(-gpus // per_host)))
        whole |= hosts is not None
    return peak(intervals, start, end), whole


def hosts_pinned(model: str, per_host: int, *, adding: tuple[int, int] | None = None) -> int:
    """Hosts of ``model`` that on-demand work holds now (an on-demand VM outside a lease on
    one of its GPUs, or waiting for the evictions that hand a host over to it) or may take:
    as many more as the guaranteed GPUs not in use fill. ``adding``: counted as if an
    on-demand VM of project ``adding[0]`` took ``adding[1]`` GPUs on one more host."""
    held = Device.objects.filter(
        kind=DeviceKind.GPU,
        model=model,
        present=True,
        lease__isnull=True,
        vm__priority=Priority.ON_DEMAND,
    ).exclude(host__state=HostState.DOWN)
    handed_over = VirtualMachine.objects.filter(
        priority=Priority.ON_DEMAND,
        gpu_model=model,
        gpus__gt=0,
        lease__isnull=True,
        state=VmState.PENDING,
        reserved_host__isnull=False,
    )
    hosts = set(held.values_list("host_id", flat=True).order_by())
    hosts |= set(handed_over.values_list("reserved_host_id", flat=True).order_by())
    minimums = CapacityGuarantee.objects.filter(gpu_model=model, min_gpus__gt=0)
    used = _on_demand_use("gpus", Q(gpu_model=model, gpus__gt=0))
    pinned = len(hosts)
    if adding is not None:
        project_id, gpus = adding
        used[project_id] = used.get(project_id, 0) + gpus
        pinned += 1
    unused = _headroom(minimums.values_list("project_id", "min_gpus"), used, None)
    return pinned + -(-unused // per_host)


def gpu_hosts(model: str) -> int:
    """Hosts (not down) with GPUs of ``model``."""
    return (
        Host.objects.exclude(state=HostState.DOWN)
        .filter(devices__kind=DeviceKind.GPU, devices__model=model, devices__present=True)
        .distinct()
        .count()
    )


def whole_hosts_refusal(vm: VirtualMachine, host_id: int) -> str:
    """Why the on-demand ``vm`` (outside a lease) may not take GPUs on host ``host_id``,
    while a lease of whole hosts of its model holds or will; "" when it may. An on-demand VM
    has no end: on a host that no on-demand VM or lease holds a GPU of, it keeps that host
    from being whole for as long as it runs, so it may take one only while the leases still
    find theirs whole at every instant to come (the hosts they take at their peak, beside
    the hosts on-demand work and unused guarantees hold, this one counted). A host where
    on-demand work or a lease already holds a GPU costs nothing more. Asked in the
    transaction that claims, under the lock of on-demand admission of the model
    (``compute.guarantees.admission_refusal`` takes it while any lease of the model holds):
    two claims never both count on the last host."""
    if vm.priority != Priority.ON_DEMAND or vm.lease_id is not None or not vm.gpus:
        return ""
    model, now = vm.gpu_model, timezone.now()
    whole_leases = Lease.objects.filter(
        gpu_model=model, state__in=leases.HOLDING, hosts__isnull=False, ends_at__gt=now
    )
    if not model or not whole_leases.exists():
        return ""
    held = Device.objects.filter(host_id=host_id, kind=DeviceKind.GPU).filter(
        Q(lease__isnull=False) | Q(vm__priority=Priority.ON_DEMAND, vm__lease__isnull=True)
    )
    if held.exists():
        return ""
    per_host = gpus_per_host(model)
    if per_host is None:
        return ""
    taken, _ = hosts_taken(model, per_host, now, None)
    pinned = hosts_pinned(model, per_host, adding=(vm.project_id, vm.gpus))
    if pinned + taken <= gpu_hosts(model):
        return ""
    return (
        f"the {model} hosts no on-demand VM holds are reserved whole by leases "
        f"({taken} hosts); waiting for capacity"
    )
