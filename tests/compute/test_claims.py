"""The claim writes all of it or nothing: a claim that loses a race leaves no row changed,
no usage interval and no row lock behind (PostgreSQL: the claim is one statement in a
savepoint), and the same transaction can then claim elsewhere; a won claim opens the VM's
usage intervals with it. The claim is planned once per connection, whatever the connection
forgot meanwhile."""

import psycopg
import pytest
from django.db import connection, transaction

from compute import claims, placement
from compute.choices import VmState
from compute.claims import ClaimConflict
from compute.models import Device, Host, VirtualMachine
from controlplane import prepared
from tenants import services as tenants
from tenants.models import UsageRecord
from tests.factories import make_host, make_project, make_template, make_vm
from tests.pg import second_connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _locked_elsewhere(other, table: str, ids) -> bool:
    """Whether a row of ``ids`` in ``table`` is locked by another transaction."""
    try:
        other.execute(f"SELECT id FROM {table} WHERE id = ANY(%s) FOR UPDATE NOWAIT", [list(ids)])
    except psycopg.errors.LockNotAvailable:
        return True
    return False


def test_a_lost_claim_writes_nothing_holds_no_lock_and_the_transaction_claims_elsewhere():
    project = make_project()
    tenants.quota_set(project=project, vms=8, vcpus=1024, memory_gib=4096, gpus=16)
    template = make_template(gpus=1)
    first, second = make_vm(project, template), make_vm(project, template)
    assert first.state == second.state == VmState.PENDING  # no host yet
    host = make_host("gpu-a")
    scheduler = placement.load_scheduler()
    req = placement.request_for(first)
    chosen = scheduler.select(req)
    with transaction.atomic():
        placement.claim(first, chosen, req)
    assert first.state == VmState.PROVISIONING

    # The second VM is claimed onto the very GPU the first now holds: a stale view.
    before = Host.objects.values_list("vcpus_used", "memory_mib_used").get(pk=host.pk)
    with second_connection() as other, transaction.atomic():
        second = VirtualMachine.objects.select_for_update().get(pk=second.pk)
        with pytest.raises(ClaimConflict, match="GPU"):
            placement.claim(second, chosen, placement.request_for(second))
        assert Host.objects.values_list("vcpus_used", "memory_mib_used").get(pk=host.pk) == before
        assert not UsageRecord.objects.filter(subject_id=str(second.pk)).exists()
        assert second.state == VmState.PENDING and second.host_id is None
        devices = list(Device.objects.filter(host=host).values_list("pk", flat=True))
        assert not _locked_elsewhere(other, "compute_host", [host.pk])
        assert not _locked_elsewhere(other, "compute_device", devices)

        # The same transaction places it on a GPU that is free.
        placement.place(second)
    second.refresh_from_db()
    assert second.state == VmState.PROVISIONING and second.host_id == host.pk
    held = list(Device.objects.filter(vm__isnull=False).values_list("vm_id", flat=True))
    assert sorted(map(str, held)) == sorted([str(first.pk), str(second.pk)])
    resources = set(
        UsageRecord.objects.filter(subject_id=str(second.pk), ended_at__isnull=True).values_list(
            "resource", "quantity"
        )
    )
    assert resources == {("vcpu", 16), ("memory", 57), ("gpu", 1)}
    used = Host.objects.values_list("vcpus_used", "memory_mib_used").get(pk=host.pk)
    assert used == (32, 2 * 57 * 1024)


def test_a_claim_of_a_vm_changed_meanwhile_writes_nothing():
    project = make_project()
    tenants.quota_set(project=project, vms=8, vcpus=1024, memory_gib=4096, gpus=16)
    vm = make_vm(project, make_template(gpus=2))
    host = make_host("gpu-a")
    req = placement.request_for(vm)
    chosen = placement.load_scheduler().select(req)
    VirtualMachine.objects.filter(pk=vm.pk).update(generation=vm.generation + 1)
    with transaction.atomic(), pytest.raises(ClaimConflict, match="changed"):
        placement.claim(vm, chosen, req)
    assert Host.objects.get(pk=host.pk).vcpus_used == 0
    assert not Device.objects.filter(vm__isnull=False).exists()
    assert not UsageRecord.objects.filter(subject_id=str(vm.pk)).exists()


def _claims_prepared() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'kumo_claim_%'")
        return cursor.fetchone()[0]


def test_the_claim_is_prepared_once_per_connection_and_again_wherever_it_was_lost():
    project = make_project()
    tenants.quota_set(project=project, vms=8, vcpus=1024, memory_gib=4096, gpus=16)
    template = make_template(gpus=1)
    vms = [make_vm(project, template) for _ in range(4)]
    host = make_host("gpu-a")

    def claim(vm):
        req = placement.request_for(vm)
        with transaction.atomic():
            placement.claim(vm, placement.load_scheduler().select(req), req)
        assert vm.state == VmState.PROVISIONING

    with connection.cursor() as cursor:  # statistics of small tables, as a young database has
        cursor.execute(
            "ANALYZE compute_host, compute_device, compute_virtualmachine, tenants_usagerecord"
        )
    sent = []

    def record(run, sql, params, many, context):
        sent.append((sql, params))
        return run(sql, params, many, context)

    with connection.execute_wrapper(record):
        claim(vms[0])
    assert _claims_prepared() == 1
    # Its plan reads rows by key, although these tables are small enough to scan whole.
    execute, params = next((sql, params) for sql, params in sent if "EXECUTE" in sql)
    with transaction.atomic(), prepared.client_cursor(connection) as cursor:  # as claims run
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        (run,) = [part for part in execute.split("; ") if part.startswith("EXECUTE")]
        cursor.execute("EXPLAIN " + run, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    assert "Index Scan using one_open_usage_interval" in plan
    for table in ("compute_host", "compute_device", "compute_virtualmachine", "tenants_usage"):
        assert f"Seq Scan on {table}" not in plan
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # the connection lost it (as after DISCARD ALL)
    claim(vms[1])
    assert _claims_prepared() == 1
    claims._prepared.clear()  # the connection has it, this process does not know
    claim(vms[2])
    assert _claims_prepared() == 1
    connection.close()  # a fresh connection has none
    claim(vms[3])
    assert _claims_prepared() == 1

    held = Device.objects.filter(vm__isnull=False).values_list("vm_id", flat=True)
    assert sorted(map(str, held)) == sorted(str(vm.pk) for vm in vms)
    assert Host.objects.get(pk=host.pk).vcpus_used == 4 * 16
    for vm in vms:
        assert UsageRecord.objects.filter(subject_id=str(vm.pk), ended_at__isnull=True).count() == 3
