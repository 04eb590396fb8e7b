"""The claim of a decided placement: the host's counters, its GPUs, the VM and its bill,
written together or not at all (``compute.placement`` decides, then asks here).

On PostgreSQL a claim is one statement, sent with its savepoint in one round trip:

1. it locks the host if it is up and has the room (``vcpus_used + v <= floor(vcpus *
   ratio)``, the same for memory), each chosen GPU if it is still free, present and held
   by the VM's lease (or by none; for a spot VM borrowing, by none or by a lease that
   lends its idle GPUs now), and the VM if it is still unplaced at the generation
   that was read (``FOR NO KEY UPDATE``, what an UPDATE takes: a claim that waited for
   another on the same row re-checks the row as that one left it);
2. only if all of them were locked, it moves the host's counters, gives the GPUs to the
   VM, moves the VM to provisioning (generation + 1) and closes and opens the VM's usage
   intervals (``tenants.usage.vm_usage_sync_ctes``, the billing app's own SQL);
3. it answers how many of each it locked. A claim that lost a race wrote nothing; it rolls
   back to its savepoint, which lets go of the rows it locked, and raises
   ``ClaimConflict``. A claim that won leaves its savepoint to the caller's commit (a
   released savepoint would cost one more round trip and free nothing).

The statement is prepared and planned once per connection (sent with the first claim of
each shape) and then only executed: planning the whole statement again for every claim
would cost more than running it. Its plan reads every row by key, however large the tables
grow. A connection that lost its prepared statements, or a fresh one, prepares them again.

So nothing is ever allocated twice: two claims of one GPU or of the last room on a host
queue on the row, and the second finds it taken. Elsewhere (SQLite, where writers are
serialised anyway) the same checks and writes run as conditional UPDATEs in a savepoint.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import NamedTuple
from uuid import UUID

from django.db import DatabaseError, connection, router, transaction
from django.db.models import F, Q
from django.db.models.functions import Floor
from django.utils import timezone

from compute.choices import HostState, LeaseState, VmState
from compute.models import Device, Host, Lease, VirtualMachine
from compute.scheduler import Placement, Request
from controlplane import prepared
from tenants import usage

_CLAIM = f"""
WITH claim_host AS (
    SELECT id FROM {Host._meta.db_table}
    WHERE id = %(host)s AND state = '{HostState.UP.value}'
      AND vcpus_used <= floor(vcpus * cpu_allocation_ratio) - %(vcpus)s
      AND memory_mib_used <= floor(memory_mib * ram_allocation_ratio) - %(memory)s
    FOR NO KEY UPDATE
),
claim_devices AS (
    SELECT id FROM {Device._meta.db_table}
    WHERE id = ANY(%(devices)s) AND host_id = %(host)s AND vm_id IS NULL AND present
      AND {{lease_holds}}
    ORDER BY id
    FOR NO KEY UPDATE
),
claim_vm AS (
    SELECT id FROM {VirtualMachine._meta.db_table}
    WHERE id = %(vm)s AND generation = %(generation)s AND host_id IS NULL
    FOR NO KEY UPDATE{{skip_locked_vm}}
),
claim_locked AS (
    SELECT (SELECT count(*) FROM claim_host) AS host,
           (SELECT count(*) FROM claim_devices) AS devices,
           (SELECT count(*) FROM claim_vm) AS vm,
           {{admitted}} AS admitted
),
claim_ok AS (
    SELECT host = 1 AND devices = %(device_count)s AND vm = 1 AND admitted AS ok
    FROM claim_locked
),
claim_host_moved AS (
    UPDATE {Host._meta.db_table}
    SET vcpus_used = vcpus_used + %(vcpus)s, memory_mib_used = memory_mib_used + %(memory)s
    WHERE id IN (SELECT id FROM claim_host) AND (SELECT ok FROM claim_ok)
    RETURNING id
),
claim_devices_given AS (
    UPDATE {Device._meta.db_table} SET vm_id = %(vm)s
    WHERE id IN (SELECT id FROM claim_devices) AND (SELECT ok FROM claim_ok)
    RETURNING id
),
claim_vm_placed AS (
    UPDATE {VirtualMachine._meta.db_table}
    SET host_id = %(host)s, numa_cell = %(cell)s, rack = %(rack)s,
        state = '{VmState.PROVISIONING.value}', state_reason = '',
        generation = %(generation)s + 1, updated_at = %(now)s
    WHERE id IN (SELECT id FROM claim_vm) AND (SELECT ok FROM claim_ok)
    RETURNING id
),
{{usage}}
SELECT host, devices, vm, admitted FROM claim_locked
"""


# Which lease may hold the GPUs a claim takes: the VM's own (or none), or, for a spot VM
# that borrows (``compute.placement``), none or an active lease that lends its idle GPUs.
_OWN_LEASE = "lease_id IS NOT DISTINCT FROM %(lease)s"
_LENDING_LEASE = (
    f"(lease_id IS NULL OR lease_id IN (SELECT id FROM {Lease._meta.db_table} "
    f"WHERE state = '{LeaseState.ACTIVE.value}' AND lend_idle))"
)


class ClaimConflict(Exception):
    """The view was stale: the host or its devices changed since it was loaded."""


class AdmissionToWeigh(Exception):
    """The claim's admission condition did not hold (a guarantee or a lease to weigh):
    nothing was written. Ask ``compute.guarantees.admission_refusal``, then claim again
    without the condition. ``room_held``: the host and its GPUs still had the room the
    view saw (False when the claim found them taken too: the view was stale as well)."""

    def __init__(self, room_held: bool = True):
        super().__init__()
        self.room_held = room_held


def devices_give(device_ids, vm_id: UUID, **where) -> int:
    """Give devices ``device_ids`` (that also match ``where``) to VM ``vm_id`` with one
    ``UPDATE … WHERE vm IS NULL``, so a device is never given to two VMs; returns how many
    were given."""
    return Device.objects.filter(pk__in=device_ids, vm__isnull=True, **where).update(vm=vm_id)


def claim_write(
    vm: VirtualMachine,
    placement: Placement,
    req: Request,
    *,
    admitted_if: tuple[str, dict] | None = None,
    borrow: bool = False,
) -> None:
    """Write the claim of ``placement`` for ``vm`` in the caller's transaction, with the
    VM's usage intervals (its bill starts with the claim); raises ``ClaimConflict``,
    leaving nothing behind, when the database disagrees. ``admitted_if``: an SQL condition
    and its parameters (``compute.guarantees.nothing_to_weigh``) checked in the same
    statement; where it does not hold, nothing is written and ``AdmissionToWeigh`` is
    raised. ``borrow``: the GPUs may be a lending lease's idle ones (a spot VM's claim).
    ``vm`` is updated in place."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        statement = claim_statement(
            vm, placement, req, at=now, admitted_if=admitted_if, borrow=borrow
        )
        with prepared.client_cursor(connection) as cursor:
            ((answer,),) = execute_prepared(cursor, statement)
        failure = claim_failure(answer, vm, placement)
        if failure is not None:
            claim_undo()
            raise failure
        claimed(vm, placement, at=now)
    else:
        if admitted_if is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {admitted_if[0]}", admitted_if[1])
                if not cursor.fetchone()[0]:
                    raise AdmissionToWeigh()
        with transaction.atomic():
            _claim_orm(vm, placement, req, now, borrow=borrow)


def _changes(vm, placement: Placement) -> dict:
    return {
        "host_id": placement.host_id,
        "numa_cell": placement.numa_cell,
        "rack": placement.rack,
        "state": VmState.PROVISIONING,
        "state_reason": "",
        "generation": vm.generation + 1,
    }


_HOST_FIELD = VirtualMachine._meta.get_field("host")


def claimed(vm: VirtualMachine, placement: Placement, *, at: datetime) -> None:
    """Update ``vm`` in place as its claim of ``placement``, written at ``at``, left its row
    (so an answer may be made from it without reading it again). Its host is the one the
    decision named, as ``Host.objects.only("id", "name")`` reads it: what its host's work
    and its audit record name, with any other field read when it is asked for."""
    for name, value in _changes(vm, placement).items():
        setattr(vm, name, value)
    vm.updated_at = at
    cached = _HOST_FIELD.get_cached_value(vm, default=None)
    if cached is None or cached.pk != vm.host_id:
        db = vm._state.db or router.db_for_write(Host)
        vm.host = Host.from_db(db, ["id", "name"], [placement.host_id, placement.host_name])


class Prepared(NamedTuple):
    """A statement to run as a prepared statement of the connection (``execute_prepared``):
    ``sql`` with ``%(name)s`` parameters, its ``params``, the savepoint taken before it,
    the prefix of its name, the statements run before and after every ``EXECUTE`` of it
    (``each``, ``after``) and ``preparing(prepare, execute)``, the statements that prepare
    it the first time."""

    sql: str
    params: dict
    savepoint: str
    prefix: str
    each: tuple[str, ...] = ()
    preparing: Callable[[str, str], tuple[str, ...]] = lambda prepare, execute: (prepare,)
    after: tuple[str, ...] = ()


def claim_statement(
    vm,
    placement: Placement,
    req: Request,
    *,
    at,
    admitted_if: tuple[str, dict] | None = None,
    skip_locked_vm: bool = False,
    borrow: bool = False,
) -> Prepared:
    """The claim of ``placement`` for ``vm`` (the VM's key, project, name, sizes, priority,
    lease and generation are read from it) at ``at``, as ``execute_prepared`` runs it: its
    answer is one row for ``claim_failure``. ``skip_locked_vm``: a VM row that another
    transaction holds counts as changed instead of being waited for (the caller has not
    locked it first, ``compute.placement.pending_claimed``). ``borrow``: see
    ``claim_write``."""
    ctes, params = usage.vm_usage_sync_ctes(
        vm, state=VmState.PROVISIONING, at=at, when="SELECT ok FROM claim_ok"
    )
    admitted, admission_params = admitted_if or ("true", {})
    params |= admission_params
    params |= {
        "host": placement.host_id,
        "vcpus": req.vcpus,
        "memory": req.memory_mib,
        "devices": _bigint_array(placement.device_ids),
        "device_count": len(placement.device_ids),
        "lease": vm.lease_id,
        "vm": str(vm.pk),  # a str: psycopg dumps a UUID in Python
        "generation": vm.generation,
        "cell": placement.numa_cell,
        "rack": placement.rack,
        "now": at,
    }
    return Prepared(
        _claim_sql_text(ctes, admitted, skip_locked_vm, borrow),
        params,
        savepoint="kumo_claim",
        prefix="kumo_claim_",
        each=(_GENERIC,),
        preparing=_preparing_claim,
        after=(_NOT_GENERIC,),
    )


def _bigint_array(ids) -> str:
    """``ids`` as PostgreSQL's literal of an array: the statement's parameter is a
    ``bigint[]``, and psycopg would dump a list in Python, item by item, with every claim."""
    return "{" + ",".join(str(int(i)) for i in ids) + "}"


def claim_failure(answer: tuple, vm, placement: Placement) -> Exception | None:
    """What to raise for the claim that gave ``answer`` (``claim_statement``); None when it
    holds. One that does not hold has locked rows and may have written: ``claim_undo``."""
    host, devices, vm_rows, admitted = answer
    if host == 1 and devices == len(placement.device_ids) and vm_rows == 1 and admitted:
        return None
    if not admitted:
        return AdmissionToWeigh(room_held=host == 1 and devices == len(placement.device_ids))
    if not host:
        return ClaimConflict(f"host {placement.host_name} no longer has the room")
    if devices != len(placement.device_ids):
        return ClaimConflict(f"a GPU of host {placement.host_name} was taken meanwhile")
    return ClaimConflict(f"vm {vm.pk} changed while it was being placed")


def claim_undo() -> None:
    """Undo the last claim of this transaction, the rows it locked with it (one round
    trip)."""
    with prepared.client_cursor(connection) as cursor:
        _execute(cursor, "ROLLBACK TO SAVEPOINT kumo_claim", "RELEASE SAVEPOINT kumo_claim")


@lru_cache(maxsize=64)
def _claim_sql_text(
    usage_ctes: str, admitted: str, skip_locked_vm: bool = False, borrow: bool = False
) -> str:
    """The claim's text with its usage intervals and admission condition: one string object
    per shape, so that finding its prepared statement costs no new hashing of it."""
    return (
        _CLAIM.replace("{usage}", usage_ctes)
        .replace("{admitted}", f"({admitted})")
        .replace("{skip_locked_vm}", " SKIP LOCKED" if skip_locked_vm else "")
        .replace("{lease_holds}", _LENDING_LEASE if borrow else _OWN_LEASE)
    )


# The claim statements prepared on each connection (a new connection starts with none).
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PARAMETER = re.compile(r"%\((\w+)\)s")
_NOT_PREPARED = "26000"  # invalid_sql_statement_name: the connection no longer has it
_ALREADY_PREPARED = "42P05"  # duplicate_prepared_statement


@lru_cache(maxsize=64)
def _prepared_form(sql: str, prefix: str) -> tuple[str, str, str]:
    """``sql`` (with ``%(name)s`` parameters) as a prepared statement: its name (from its
    text, so each shape of claim has its own), the ``PREPARE`` (parameters numbered in order
    of first use, their types inferred from where they are used) and the ``EXECUTE`` taking
    the same named parameters."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    body = _PARAMETER.sub(number, sql)
    name = prefix + hashlib.sha1(body.encode()).hexdigest()[:16]
    arguments = ", ".join(f"%({n})s" for n in names)
    return name, f"PREPARE {name} AS {body}", f"EXECUTE {name}({arguments})"


# The claim's cached plan, for the claim alone: every statement after it in the transaction
# (bound server-side, ``controlplane.prepared``) is planned as PostgreSQL would plan it.
_GENERIC = "SET LOCAL plan_cache_mode = force_generic_plan"
_NOT_GENERIC = "SET LOCAL plan_cache_mode TO DEFAULT"


def _preparing_claim(prepare: str, execute: str) -> tuple[str, ...]:
    """How a claim statement is prepared, with the first claim of its shape on a connection.
    With Django's default client-side binding the claim is a prepared statement of this
    connection, planned once, the first time, in the same round trip: PostgreSQL then runs
    the cached plan instead of planning every claim again.

    That plan reads every row by its key, whatever the tables' sizes (a plan made on a
    young, small usage table would scan it whole as it grows): it is made with sequential
    scans off, and JIT compilation too (the prohibitive cost then given to the scans it
    cannot avoid, of tables without a usable index, would call for it at every run), in a
    savepoint rolled back before the claim runs, so the settings go with it. Claims then
    use that plan (``plan_cache_mode``, sent before each claim, for the prepared statements
    run after it in this transaction: the claim and its retries). PostgreSQL plans it again,
    as it would any statement, when a table it reads is analysed or altered."""
    return (
        "SET LOCAL enable_seqscan = off",
        "SET LOCAL jit = off",  # a scan it cannot avoid would count as worth compiling
        _GENERIC,
        prepare,
        f"EXPLAIN {execute}",  # plans it and keeps the plan, running nothing
        "ROLLBACK TO SAVEPOINT kumo_claim",
    )


def execute_prepared(cursor, *statements: Prepared) -> list[list[tuple]]:
    """Run ``statements``, each after its savepoint, as prepared statements of this
    connection, all in one round trip; returns each one's rows. Each is named from its
    prefix and its text, prepared with its first run on the connection (in the same round
    trip), then only executed. The savepoints are left to the caller's commit. Their
    parameters must have distinct names.

    This is the claim's way, not psycopg's statement cache: psycopg forgets every statement
    it prepared (``DEALLOCATE ALL``) whenever a statement it runs answers ``ROLLBACK``,
    which a claim that lost a race does when it rolls back to its savepoint; statements
    prepared here are unknown to psycopg and stay. One the connection lost anyway (a
    ``DEALLOCATE ALL`` or ``DISCARD ALL`` from elsewhere), or one it has that this process
    did not know of, is noticed by its error: everything rolls back to the first savepoint,
    which is why they are taken (the caller's transaction goes on), this process asks the
    connection which statements it has, and sends them again, prepared as it needs.

    ``cursor`` writes the values into the text (``controlplane.prepared.client_cursor``):
    server-side binding cannot send two statements at once."""
    params: dict = {}
    for statement in statements:
        params |= statement.params
    forms = [_prepared_form(statement.sql, statement.prefix) for statement in statements]
    known = _prepared.setdefault(connection.connection, set())
    for attempt in range(2):
        texts, answers = [], []
        for statement, (name, prepare, execute) in zip(statements, forms, strict=True):
            texts += [f"SAVEPOINT {statement.savepoint}", *statement.each]
            if name not in known:
                texts += statement.preparing(prepare, execute)
            answers.append(len(texts))
            texts += [execute, *statement.after]
        try:
            rows = _execute(cursor, *texts, params=params, answers=answers)
        except DatabaseError as e:
            state = getattr(e.__cause__, "sqlstate", None)
            if state not in (_NOT_PREPARED, _ALREADY_PREPARED) or attempt:
                raise
            cursor.execute(f"ROLLBACK TO SAVEPOINT {statements[0].savepoint}")
            cursor.execute("SELECT name FROM pg_prepared_statements")
            known.clear()
            known.update(name for (name,) in cursor.fetchall())
            continue
        known.update(name for name, _, _ in forms)
        return rows
    raise AssertionError("unreachable: the second attempt returns or raises")


def _execute(
    cursor, *statements: str, params: dict | None = None, answers: list[int] = ()
) -> list[list[tuple]]:
    """Run ``statements`` (the last one with ``params``) and return the rows of those at
    positions ``answers``: as one query string, one round trip, on a cursor that writes the
    values into the text (``controlplane.prepared.client_cursor``)."""
    rows = []
    cursor.execute("; ".join(statements), params)
    for i in range(len(statements)):
        if i:
            cursor.nextset()
        if i in answers:
            rows.append(cursor.fetchall())
    return rows


def _claim_orm(
    vm: VirtualMachine, placement: Placement, req: Request, now, *, borrow: bool
) -> None:
    moved = Host.objects.filter(
        pk=placement.host_id,
        state=HostState.UP,
        vcpus_used__lte=Floor(F("vcpus") * F("cpu_allocation_ratio")) - req.vcpus,
        memory_mib_used__lte=Floor(F("memory_mib") * F("ram_allocation_ratio")) - req.memory_mib,
    ).update(
        vcpus_used=F("vcpus_used") + req.vcpus,
        memory_mib_used=F("memory_mib_used") + req.memory_mib,
    )
    if not moved:
        raise ClaimConflict(f"host {placement.host_name} no longer has the room")
    if placement.device_ids:
        # A lease's GPUs go to its VMs only, or to a spot VM borrowing while it lends.
        holds = Q(lease_id=vm.lease_id)
        if borrow:
            holds = Q(lease__isnull=True) | Q(lease__state=LeaseState.ACTIVE, lease__lend_idle=True)
        taken = Device.objects.filter(
            holds,
            pk__in=placement.device_ids,
            vm__isnull=True,
            host_id=placement.host_id,
            present=True,
        ).update(vm=vm.pk)
        if taken != len(placement.device_ids):
            raise ClaimConflict(f"a GPU of host {placement.host_name} was taken meanwhile")
    updated = VirtualMachine.objects.filter(
        pk=vm.pk, generation=vm.generation, host__isnull=True
    ).update(**_changes(vm, placement), updated_at=now)
    if not updated:
        raise ClaimConflict(f"vm {vm.pk} changed while it was being placed")
    claimed(vm, placement, at=now)
    usage.vm_usage_sync(vm, at=now)
