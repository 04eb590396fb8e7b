"""The guests report of a host where nothing happened: recognized and recorded in two
statements.

A fleet's hosts report their guests every period, and almost every report says what the
database already holds. ``guests_in_step`` tells those apart from the rest exactly (any
difference, on either side, answers no and leaves the full comparison of
``compute.services.reconcile`` to act on it) and records what the full comparison would
record of them: the time and the CPU samples. The statements are written out: the ORM takes
longer to build them than PostgreSQL takes to run them, a fleet sends hundreds a second, and
the controller's CPU is what they are paid with.
"""

from datetime import datetime
from types import SimpleNamespace

from django.db import connection, transaction
from django.utils import timezone

from compute.choices import PowerState, VmState
from compute.models import Host, OrphanGuest, VirtualMachine
from compute.services import reclaim

# A settled VM's state, and the power its guest is in then.
_SETTLED = {VmState.RUNNING: PowerState.RUNNING, VmState.STOPPED: PowerState.SHUTOFF}
_COLUMNS = (
    "id",
    "state",
    "task_state",
    "state_reason",
    "generation",
    "applied_generation",
    "power_state",
    "launched_at",
    "vcpus",
    "cpu_time_ns",
    "cpu_sampled_at",
    "active_at",
)


def guests_in_step(host: str, reported: dict, sent_at: datetime) -> bool:
    """Whether ``host``'s guests report (``reported``: vm id to guest) needs nothing but to
    be recorded; if so it is recorded, in one transaction.

    In step means: the host is known, the report is newer than the last one recorded, the
    host has no orphan guests on record; the guests reported are exactly the host's live VMs
    (all but deleted and pending ones); each VM is running or stopped with no task and no
    reason (a running one launched), its guest at its generation (applied too) and in the
    power its state wants, the power Kumo last saw. The full comparison would then find no
    drift, settle nothing and destroy nothing: it would only write the observation, which is
    what is written here, ``guests_reported_at``, ``power_observed_at`` and the CPU sample
    (``reclaim.cpu_observed``). A VM's ``updated_at`` stays, since nothing of it changed.

    Locks the host's row first, then its VMs: the order of every writer of a host's VMs.
    The statements are PostgreSQL's; elsewhere every report takes the full comparison."""
    if connection.vendor != "postgresql":
        return False
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_READ, [sent_at, now, host, sent_at])
        rows = cursor.fetchall()
        if not rows:
            return False  # unknown host, an older report, or orphans on record
        vms = [SimpleNamespace(**dict(zip(_COLUMNS, row[1:], strict=True))) for row in rows]
        vms = [vm for vm in vms if vm.id is not None]  # a host with no VMs: one empty row
        if len(vms) != len(reported) or not all(
            _settled(vm, reported.get(str(vm.id))) for vm in vms
        ):
            transaction.set_rollback(True)
            return False
        for vm in vms:
            sample = reclaim.cpu_observed(vm, reported[str(vm.id)].get("cpu_time_ns"), now)
            for k, v in sample.items():
                setattr(vm, k, v)
        if vms:
            cursor.execute(_WRITE, [now, *([getattr(vm, c) for vm in vms] for c in _SAMPLE)])
    return True


def _settled(vm, guest: dict | None) -> bool:
    """Whether ``guest`` (None: not reported) shows ``vm`` exactly as the database has it,
    settled: nothing for the guests report to act on or record but the observation."""
    power = _SETTLED.get(vm.state)
    return (
        guest is not None
        and power is not None
        and not vm.task_state
        and not vm.state_reason
        and guest.get("generation") == vm.generation == vm.applied_generation
        and guest.get("power") == power == vm.power_state
        and (vm.launched_at is not None or vm.state != VmState.RUNNING)
    )


_HOST = Host._meta.db_table
_VM = VirtualMachine._meta.db_table
_ORPHAN = OrphanGuest._meta.db_table
# The host's row moved (and locked) if the report is newer and no orphan is on record, then
# its live VMs as they are; no row at all when the host's row did not move.
_READ = f"""
WITH host AS (
    UPDATE {_HOST} SET guests_reported_at = %s, updated_at = %s
    WHERE name = %s
      AND (guests_reported_at IS NULL OR guests_reported_at < %s)
      AND NOT EXISTS (SELECT 1 FROM {_ORPHAN} o WHERE o.host_id = {_HOST}.id)
    RETURNING id
)
SELECT host.id, {", ".join(f"vm.{c}" for c in _COLUMNS)}
FROM host LEFT JOIN {_VM} vm
  ON vm.host_id = host.id AND vm.state NOT IN ('{VmState.DELETED}', '{VmState.PENDING}')
ORDER BY vm.id
"""
# The samples as one array per column, in this order: the same text for any number of
# guests, so that it is prepared once per connection (``controlplane.prepared``).
_SAMPLE = ("id", "cpu_time_ns", "cpu_sampled_at", "active_at")
_WRITE = f"""
UPDATE {_VM} AS vm
SET power_observed_at = %s, cpu_time_ns = v.cpu_time_ns, cpu_sampled_at = v.cpu_sampled_at,
    active_at = v.active_at
FROM unnest(%s::uuid[], %s::bigint[], %s::timestamptz[], %s::timestamptz[])
  AS v ({", ".join(_SAMPLE)})
WHERE vm.id = v.id
"""
