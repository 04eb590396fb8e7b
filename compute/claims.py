"""The claim of a decided placement: the host's counters, its GPUs, the VM and its bill,
written together or not at all (``compute.placement`` decides, then asks here).

On PostgreSQL a claim is one statement, sent with its savepoint in one round trip:

1. it locks the host if it is up and has the room (``vcpus_used + v <= floor(vcpus *
   ratio)``, the same for memory), each chosen GPU if it is still free, present and held
   by the VM's lease (or by none), and the VM if it is still unplaced at the generation
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
from functools import lru_cache
from uuid import UUID

from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.db.models.functions import Floor
from django.utils import timezone

from compute.choices import HostState, VmState
from compute.models import Device, Host, VirtualMachine
from compute.scheduler import Placement, Request
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
      AND lease_id IS NOT DISTINCT FROM %(lease)s
    ORDER BY id
    FOR NO KEY UPDATE
),
claim_vm AS (
    SELECT id FROM {VirtualMachine._meta.db_table}
    WHERE id = %(vm)s AND generation = %(generation)s AND host_id IS NULL
    FOR NO KEY UPDATE
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


class ClaimConflict(Exception):
    """The view was stale: the host or its devices changed since it was loaded."""


class AdmissionToWeigh(Exception):
    """The claim's admission condition did not hold (a guarantee or a lease to weigh):
    nothing was written. Ask ``compute.guarantees.admission_refusal``, then claim again
    without the condition."""


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
) -> None:
    """Write the claim of ``placement`` for ``vm`` in the caller's transaction, with the
    VM's usage intervals (its bill starts with the claim); raises ``ClaimConflict``,
    leaving nothing behind, when the database disagrees. ``admitted_if``: an SQL condition
    and its parameters (``compute.guarantees.nothing_to_weigh``) checked in the same
    statement; where it does not hold, nothing is written and ``AdmissionToWeigh`` is
    raised. ``vm`` is updated in place."""
    changes = {
        "host_id": placement.host_id,
        "numa_cell": placement.numa_cell,
        "rack": placement.rack,
        "state": VmState.PROVISIONING,
        "state_reason": "",
        "generation": vm.generation + 1,
    }
    now = timezone.now()
    if connection.vendor == "postgresql":
        _claim_sql(vm, placement, req, now, admitted_if)
    else:
        if admitted_if is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {admitted_if[0]}", admitted_if[1])
                if not cursor.fetchone()[0]:
                    raise AdmissionToWeigh()
        with transaction.atomic():
            _claim_orm(vm, placement, req, now, changes)
    for name, value in changes.items():
        setattr(vm, name, value)


def _claim_sql(vm: VirtualMachine, placement: Placement, req: Request, now, admitted_if) -> None:
    ctes, params = usage.vm_usage_sync_ctes(
        vm, state=VmState.PROVISIONING, at=now, when="SELECT ok FROM claim_ok"
    )
    admitted, admission_params = admitted_if or ("true", {})
    params |= admission_params
    params |= {
        "host": placement.host_id,
        "vcpus": req.vcpus,
        "memory": req.memory_mib,
        "devices": list(placement.device_ids),
        "device_count": len(placement.device_ids),
        "lease": vm.lease_id,
        "vm": vm.pk,
        "generation": vm.generation,
        "cell": placement.numa_cell,
        "rack": placement.rack,
        "now": now,
    }
    sql = _claim_sql_text(ctes, admitted)
    with connection.cursor() as cursor:
        _execute_claim(cursor, sql, params)
        host, devices, vm_rows, admitted = cursor.fetchone()
        if host == 1 and devices == len(placement.device_ids) and vm_rows == 1 and admitted:
            return
        _execute(cursor, "ROLLBACK TO SAVEPOINT kumo_claim", "RELEASE SAVEPOINT kumo_claim")
    if not admitted:
        raise AdmissionToWeigh()
    if not host:
        raise ClaimConflict(f"host {placement.host_name} no longer has the room")
    if devices != len(placement.device_ids):
        raise ClaimConflict(f"a GPU of host {placement.host_name} was taken meanwhile")
    raise ClaimConflict(f"vm {vm.pk} changed while it was being placed")


@lru_cache(maxsize=64)
def _claim_sql_text(usage_ctes: str, admitted: str) -> str:
    """The claim's text with its usage intervals and admission condition: one string object
    per shape, so that finding its prepared statement costs no new hashing of it."""
    return _CLAIM.replace("{usage}", usage_ctes).replace("{admitted}", f"({admitted})")


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


_GENERIC = "SET LOCAL plan_cache_mode = force_generic_plan"  # prepared statements only


def _execute_claim(cursor, sql: str, params: dict) -> None:
    """``SAVEPOINT kumo_claim`` then the claim ``sql``, in one round trip, leaving the
    cursor on the claim's answer. With Django's default client-side binding the claim is a
    prepared statement of this connection, planned once, the first time, in the same round
    trip: PostgreSQL then runs the cached plan instead of planning every claim again.

    That plan reads every row by its key, whatever the tables' sizes (a plan made on a
    young, small usage table would scan it whole as it grows): it is made with sequential
    scans off, and JIT compilation too (the prohibitive cost then given to the scans it
    cannot avoid, of tables without a usable index, would call for it at every run), in a
    savepoint rolled back before the claim runs, so the settings go with it. Claims then
    use that plan (``plan_cache_mode``, for the prepared statements run after it in this
    transaction: the claim and its retries). PostgreSQL plans it again, as it would any
    statement, when a table it reads is analysed or altered.

    A prepared statement outlives a rolled-back transaction; one the connection lost (or
    one it has that this process did not know of) is noticed by its error, after which the
    claim rolls back to its savepoint and sends it again, prepared as the connection
    needs."""
    execute_prepared(
        cursor,
        sql,
        params,
        savepoint="kumo_claim",
        prefix="kumo_claim_",
        each=(_GENERIC,),
        preparing=lambda prepare, execute: (
            "SET LOCAL enable_seqscan = off",
            "SET LOCAL jit = off",  # a scan it cannot avoid would count as worth compiling
            _GENERIC,
            prepare,
            f"EXPLAIN {execute}",  # plans it and keeps the plan, running nothing
            "ROLLBACK TO SAVEPOINT kumo_claim",
        ),
    )


def execute_prepared(
    cursor,
    sql: str,
    params: dict,
    *,
    savepoint: str,
    prefix: str,
    each: tuple[str, ...] = (),
    preparing=lambda prepare, execute: (prepare,),
) -> None:
    """``SAVEPOINT savepoint`` then ``sql`` (with ``%(name)s`` parameters) as a prepared
    statement of this connection named from ``prefix`` and its text, in one round trip,
    leaving the cursor on its answer: prepared with its first run on the connection (in the
    same round trip), then only executed. The savepoint is left to the caller's commit.

    This is the claim's way (``_execute_claim``), not psycopg's statement cache: psycopg
    forgets every statement it prepared (``DEALLOCATE ALL``) whenever a statement it runs
    answers ``ROLLBACK``, which a claim that lost a race does when it rolls back to its
    savepoint; statements prepared here are unknown to psycopg and stay. One the connection
    lost anyway (a ``DEALLOCATE ALL`` or ``DISCARD ALL`` from elsewhere) is noticed by its
    error, after which it rolls back to the savepoint and sends it again prepared, which is
    why a savepoint is taken: the caller's transaction goes on.

    ``each`` are statements run before every ``EXECUTE``; ``preparing(prepare, execute)``
    the statements that prepare it, the first time (by default the ``PREPARE`` alone; the
    claim's also plans it, ``_execute_claim``)."""
    if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        _execute(cursor, f"SAVEPOINT {savepoint}", sql, params=params)
        return
    name, prepare, execute = _prepared_form(sql, prefix)
    known = _prepared.setdefault(connection.connection, set())
    for attempt in range(2):
        statements = [f"SAVEPOINT {savepoint}", *each, execute]
        if name not in known:
            statements[1:1] = preparing(prepare, execute)
        try:
            _execute(cursor, *statements, params=params)
        except DatabaseError as e:
            state = getattr(e.__cause__, "sqlstate", None)
            if state not in (_NOT_PREPARED, _ALREADY_PREPARED) or attempt:
                raise
            cursor.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
            if state == _NOT_PREPARED:
                known.discard(name)
            else:
                known.add(name)
            continue
        known.add(name)
        return


def _execute(cursor, *statements: str, params: dict | None = None) -> None:
    """Run ``statements`` (the last one with ``params``), leaving the cursor on the last
    one's result: as one query string, one round trip, with Django's default client-side
    binding; one by one with server-side binding, which cannot send two at once."""
    if connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        for statement in statements[:-1]:
            cursor.execute(statement)
        cursor.execute(statements[-1], params)
        return
    cursor.execute("; ".join(statements), params)
    for _ in statements[1:]:
        cursor.nextset()


def _claim_orm(vm: VirtualMachine, placement: Placement, req: Request, now, changes) -> None:
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
        taken = devices_give(
            placement.device_ids,
            vm.pk,
            host_id=placement.host_id,
            present=True,
            lease_id=vm.lease_id,  # a lease's GPUs go to its VMs only
        )
        if taken != len(placement.device_ids):
            raise ClaimConflict(f"a GPU of host {placement.host_name} was taken meanwhile")
    updated = VirtualMachine.objects.filter(
        pk=vm.pk, generation=vm.generation, host__isnull=True
    ).update(**changes, updated_at=now)
    if not updated:
        raise ClaimConflict(f"vm {vm.pk} changed while it was being placed")
    for name, value in changes.items():
        setattr(vm, name, value)
    usage.vm_usage_sync(vm, at=now)
