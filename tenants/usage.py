"""Usage intervals: what each billable object used, from when to when, exactly.

Every state change of a billable object calls in here, in the same transaction:

- ``vm_usage_sync(vm, at)`` after any change of a VM's state (``compute.services.vms``'s
  ``_transition``, ``_place`` and ``vm_finish_delete``; ``compute.services.reconcile``
  wherever the host's observation or the reaper moves a VM);
- ``usage_open`` / ``usage_close`` for anything else: global IPs (allocate opens, release
  closes), and storage.

Guarantees:

- **Idempotent.** ``vm_usage_sync`` makes the VM's open intervals match its state; called
  again with the same state it changes nothing. ``usage_open`` of what is already open with
  the same quantity and priority changes nothing; ``usage_close`` of nothing open changes
  nothing.
- **No overlap.** For one (subject, resource, model) at most one interval is open (a unique
  index), and an interval never starts before the previous one of the same key ended: an
  ``at`` earlier than that (a clock step back between two controllers) is moved up to it.
- **Exact.** Start and end are the instants of the state changes; quantities are Decimal
  (memory in GiB is ``memory_mib / 1024``, exact to 10 places).

What a VM bills, by state: ``provisioning``, ``running`` and ``evicting`` (the guest still
runs during its eviction notice) bill its vCPUs, memory (GiB) and GPUs (by model), with its
priority (spot or on-demand). Holding is never free: a ``stopped`` VM (and a ``shelving``
one, until its host has let go) keeps its claim, so it bills the same vCPUs, memory and
GPUs at priority ``held`` (the rate card's ``held_factor``) plus its root disk as storage.
A ``shelved`` VM holds no claim and bills its kept root disk as storage only, as does a
pending VM waiting to be unshelved. An evicted spot VM stops paying at the eviction, a
deleting VM stops paying when its deletion is asked.
"""

from datetime import datetime
from decimal import Decimal
from functools import lru_cache

from django.db.models import F, Max, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from controlplane.compiled import Compiled, CompiledUpdate
from tenants.choices import BillingPriority, UsageResource
from tenants.models import UsageRecord

VM_SUBJECT = "compute.virtualmachine"
BILLABLE_VM_STATES = frozenset({"provisioning", "running", "evicting"})
HELD_VM_STATES = frozenset({"stopped", "shelving"})


def _subject(subject) -> tuple[str, str]:
    return subject._meta.label_lower, str(subject.pk)


def vm_usage_wanted(vm, *, state: str | None = None) -> dict[tuple[str, str], tuple[Decimal, str]]:
    """What ``vm`` should have open now (or once in ``state``): (resource, model) ->
    (quantity, priority)."""
    state = state or vm.state
    disk = {(UsageResource.STORAGE.value, ""): (Decimal(vm.disk_gib), BillingPriority.ON_DEMAND)}
    kept = bool(getattr(vm, "kept_disk", ""))
    if state == "shelved" or (state == "pending" and kept):
        return disk if vm.disk_gib else {}
    if state not in BILLABLE_VM_STATES and state not in HELD_VM_STATES:
        return {}
    priority = vm.priority if vm.priority in BillingPriority.values else BillingPriority.ON_DEMAND
    leased = getattr(vm, "lease_id", None) is not None
    if leased:
        priority = BillingPriority.RESERVED  # its GPUs are the lease's, billed with the lease
    if state in HELD_VM_STATES:
        priority = BillingPriority.HELD
    wanted = {
        (UsageResource.VCPU.value, ""): (Decimal(vm.vcpus), priority),
        (UsageResource.MEMORY.value, ""): (Decimal(vm.memory_mib) / Decimal(1024), priority),
    }
    if vm.gpus and not leased:
        wanted[(UsageResource.GPU.value, vm.gpu_model or "")] = (Decimal(vm.gpus), priority)
    if state in HELD_VM_STATES and vm.disk_gib:
        wanted.update(disk)
    return {key: value for key, value in wanted.items() if value[0] > 0}


def vm_usage_sync(vm, at: datetime | None = None, *, before: dict | None = None) -> int:
    """Make ``vm``'s open usage intervals match its state at ``at``; returns how many
    intervals it opened or closed (0 when they already matched). Call in the transaction
    that changed the state, after the change. An evicted VM stops paying at its eviction
    time (``evicted_at``, set by ``compute.services.spot`` in the same transition).

    ``before``: what the VM billed before the change (``vm_usage_wanted`` then). Every
    change syncs the intervals in its transaction, so they matched it: a change that bills
    the same (provisioning to running, a notice, a task begun) reads and writes nothing."""
    if before is not None and vm_usage_wanted(vm) == before:
        return 0
    at = at or timezone.now()
    if vm.state == "evicted" and getattr(vm, "evicted_at", None) is not None:
        at = vm.evicted_at
    return _sync(
        project_id=vm.project_id,
        subject_type=VM_SUBJECT,
        subject_id=str(vm.pk),
        subject_name=vm.name,
        wanted=vm_usage_wanted(vm),
        at=at,
    )


# Every state change of a VM reads its intervals: compiled once (``controlplane.compiled``).
_INTERVALS = Compiled(
    lambda subject_type, subject_id: UsageRecord.objects.filter(
        subject_type=subject_type, subject_id=subject_id
    ).values_list("pk", "resource", "model", "quantity", "priority", "ended_at"),
    str,
    str,
)


#: The UPDATE closing a subject's stale intervals, by how many (``_closing``).
_CLOSINGS: dict[int, CompiledUpdate] = {}


def _closing(count: int) -> CompiledUpdate:
    """The UPDATE that ends ``count`` open intervals at a time (and not before each one's
    start), compiled once for each count: a VM's state change ends one to three."""
    update = _CLOSINGS.get(count)
    if update is None:
        update = _CLOSINGS[count] = CompiledUpdate(
            lambda *values: (
                UsageRecord.objects.filter(pk__in=values[:-1], ended_at__isnull=True),
                {"ended_at": Greatest(Value(values[-1]), F("started_at"))},
            ),
            *(int,) * count,
            datetime,
        )
    return update


def _sync(*, project_id, subject_type, subject_id, subject_name, wanted, at) -> int:
    """At most three queries, two in the common case (a VM placed or stopped): the
    subject's intervals (open ones and the last end of each resource, in one read); one
    UPDATE closing those that no longer match; one INSERT for those to open."""
    open_, last_end = {}, {}
    for pk, resource, model, quantity, priority, ended_at in _INTERVALS.tuples(
        subject_type, subject_id
    ):
        key = (resource, model)
        if ended_at is None:
            open_[key] = (pk, (quantity, priority))
        elif last_end.get(key) is None or ended_at > last_end[key]:
            last_end[key] = ended_at
    stale = [pk for key, (pk, have) in open_.items() if wanted.get(key) != have]
    if stale:
        _closing(len(stale)).run(*stale, at)
    to_open = [key for key, want in wanted.items() if key not in open_ or open_[key][1] != want]
    if to_open:
        UsageRecord.objects.bulk_create(
            UsageRecord(
                project_id=project_id,
                subject_type=subject_type,
                subject_id=subject_id,
                subject_name=subject_name[:200],
                resource=resource,
                model=model,
                priority=wanted[(resource, model)][1],
                quantity=wanted[(resource, model)][0],
                started_at=max(at, last_end.get((resource, model)) or at),
            )
            for resource, model in to_open
        )
    return len(stale) + len(to_open)


def vm_usage_sync_ctes(vm, *, state: str, at: datetime, when: str) -> tuple[str, dict]:
    """``vm_usage_sync`` of ``vm`` once in ``state``, as data-modifying CTEs that the caller
    puts in the WITH list of the PostgreSQL statement that makes that change, so the VM's
    state and its bill are written in one round trip (``compute.claims``). They close and
    open the intervals ``_sync`` would, at ``at``, each opened one starting no earlier than
    the last end of its key, and only where the caller's SQL condition ``when`` holds:
    otherwise they write nothing. Returns the CTE text (``usage_wanted``, ``usage_closed``,
    ``usage_opened``; no leading comma) and its parameters (named ``usage_*``)."""
    wanted = vm_usage_wanted(vm, state=state)
    params = {
        "usage_project": vm.project_id,
        "usage_id": str(vm.pk),
        "usage_name": vm.name[:200],
        "usage_at": at,
    }
    for i, ((resource, model), (quantity, priority)) in enumerate(wanted.items()):
        params |= {
            f"usage_r{i}": resource,
            f"usage_m{i}": model,
            f"usage_q{i}": quantity,
            f"usage_p{i}": str(priority),
        }
    return _vm_usage_sync_sql(len(wanted), when), params


@lru_cache(maxsize=16)
def _vm_usage_sync_sql(rows: int, when: str) -> str:
    """The text of ``vm_usage_sync_ctes`` for ``rows`` wanted intervals: one string object
    per shape, so the claim that holds it is built, hashed and found prepared unchanged."""
    values = (
        "VALUES "
        + ", ".join(
            f"(%(usage_r{i})s::varchar, %(usage_m{i})s::varchar,"
            f" %(usage_q{i})s::numeric, %(usage_p{i})s::varchar)"
            for i in range(rows)
        )
        if rows
        else "SELECT NULL::varchar, NULL::varchar, NULL::numeric, NULL::varchar WHERE false"
    )
    table = UsageRecord._meta.db_table
    subject = f"'{VM_SUBJECT}'"  # a constant of the code, written in the statement
    mine = f"subject_type = {subject} AND subject_id = %(usage_id)s"
    return f"""usage_wanted (resource, model, quantity, priority) AS ({values}),
usage_closed AS (
    UPDATE {table} SET ended_at = GREATEST(%(usage_at)s, started_at)
    WHERE {mine} AND ended_at IS NULL AND ({when})
      AND (resource, model, quantity, priority) NOT IN (SELECT * FROM usage_wanted)
    RETURNING id
),
usage_opened AS (
    INSERT INTO {table} (project_id, subject_type, subject_id, subject_name, resource,
                         model, priority, quantity, started_at, ended_at)
    SELECT %(usage_project)s::bigint, {subject}::varchar, %(usage_id)s::varchar,
           %(usage_name)s::varchar, w.resource,
           w.model, w.priority, w.quantity,
           GREATEST(%(usage_at)s, (SELECT max(ended_at) FROM {table}
                                   WHERE {mine} AND resource = w.resource
                                     AND model = w.model)),
           NULL
    FROM usage_wanted w
    WHERE ({when})
      AND (SELECT count(*) FROM usage_closed) >= 0  -- closed first: one open per key
      AND NOT EXISTS (SELECT 1 FROM {table}
                      WHERE {mine} AND ended_at IS NULL AND resource = w.resource
                        AND model = w.model AND quantity = w.quantity
                        AND priority = w.priority)
    RETURNING id
)"""


def _close(record: UsageRecord, at: datetime) -> None:
    end = max(at, record.started_at)
    UsageRecord.objects.filter(pk=record.pk, ended_at__isnull=True).update(ended_at=end)
    record.ended_at = end


def _not_before_last_end(subject_type, subject_id, resource, model, at) -> datetime:
    last = UsageRecord.objects.filter(
        subject_type=subject_type, subject_id=subject_id, resource=resource, model=model
    ).aggregate(end=Max("ended_at"))["end"]
    return max(at, last) if last is not None else at


def usage_open(
    subject,
    resource: str,
    quantity,
    at: datetime | None = None,
    *,
    model: str = "",
    priority: str = BillingPriority.ON_DEMAND,
    name: str | None = None,
) -> UsageRecord:
    """Open (or keep open) the interval of ``subject``'s ``resource`` at ``at``.

    ``subject`` is any model instance with a ``project_id`` (a volume, a bucket, a global
    IP). Already open with the same quantity and priority: nothing changes. Open with
    another quantity (a volume grown): the old interval closes and a new one opens at
    ``at``. Returns the open interval."""
    if resource not in UsageResource.values:
        raise ValueError(f"unknown usage resource {resource!r}")
    at = at or timezone.now()
    subject_type, subject_id = _subject(subject)
    key = (resource, model)
    _sync_one(
        project_id=subject.project_id,
        subject_type=subject_type,
        subject_id=subject_id,
        subject_name=name if name is not None else str(subject),
        key=key,
        want=(Decimal(quantity), priority),
        at=at,
    )
    return UsageRecord.objects.get(
        subject_type=subject_type,
        subject_id=subject_id,
        resource=resource,
        model=model,
        ended_at__isnull=True,
    )


def _sync_one(*, project_id, subject_type, subject_id, subject_name, key, want, at) -> None:
    resource, model = key
    record = UsageRecord.objects.filter(
        subject_type=subject_type,
        subject_id=subject_id,
        resource=resource,
        model=model,
        ended_at__isnull=True,
    ).first()
    if record is not None and (record.quantity, record.priority) == want:
        return
    if record is not None:
        _close(record, at)
    UsageRecord.objects.create(
        project_id=project_id,
        subject_type=subject_type,
        subject_id=subject_id,
        subject_name=subject_name[:200],
        resource=resource,
        model=model,
        priority=want[1],
        quantity=want[0],
        started_at=_not_before_last_end(subject_type, subject_id, resource, model, at),
    )


def usage_close(
    subject, resource: str, quantity=None, at: datetime | None = None, *, model: str = ""
) -> int:
    """Close the open interval of ``subject``'s ``resource`` (and ``model``) at ``at``;
    returns how many closed (0 when none was open). ``quantity`` is accepted for symmetry
    with ``usage_open`` and not used: the open interval closes whatever its quantity."""
    at = at or timezone.now()
    subject_type, subject_id = _subject(subject)
    closed = 0
    for record in UsageRecord.objects.filter(
        subject_type=subject_type,
        subject_id=subject_id,
        resource=resource,
        model=model,
        ended_at__isnull=True,
    ):
        _close(record, at)
        closed += 1
    return closed
