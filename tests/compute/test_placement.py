"""``placement.pending_locked``, the read a scheduler makes before it places a VM: on
PostgreSQL its SQL is compiled once and runs prepared, and it answers exactly what the ORM's
query answers (every column, the same related objects, None where the ORM finds nothing),
with the VM's row locked and nobody else's."""

from unittest import mock

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from compute import claims, placement, services
from compute.choices import DeviceKind, VmState
from compute.models import Device, Host, VirtualMachine
from compute.scheduler import NoValidHost
from tenants import services as tenants
from tenants.models import UsageRecord
from tests.factories import make_host, make_image, make_project, make_template, make_vm
from tests.pg import second_connection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _orm(pk):
    """The ORM's own query for what ``pending_locked`` reads."""
    return placement._pending(pk, skip_locked=False).first()


def _project(slug):
    project = make_project(slug=slug)
    tenants.quota_set(project=project, vms=8, vcpus=1024, memory_gib=4096, gpus=16)
    return project


def _fields(vm) -> dict:
    return {field.attname: getattr(vm, field.attname) for field in vm._meta.concrete_fields}


def test_it_answers_what_the_orm_answers_with_the_same_related_objects(django_assert_num_queries):
    mine, theirs = _project("mine"), _project("theirs")
    group = services.placement_group_create(project=mine, name="pair", policy="affinity")
    template = make_template(gpus=1)
    vm = make_vm(mine, template, placement_group=group)
    other = make_vm(theirs, template)
    assert vm.state == other.state == VmState.PENDING  # no host: nothing placed them
    for wanted in (vm, other):
        for _ in range(3):  # compiled on the first, prepared by the second
            with transaction.atomic():
                expected = _orm(wanted.pk)
                got = placement.pending_locked(wanted.pk)
                assert type(got) is VirtualMachine and got.pk == wanted.pk
                assert _fields(got) == _fields(expected)
                assert got.get_deferred_fields() == set()
                with django_assert_num_queries(0):
                    related = (got.project, got.image, got.placement_group)
                assert related == (expected.project, expected.image, expected.placement_group)
                for mine_, theirs_ in zip(
                    related,
                    (expected.project, expected.image, expected.placement_group),
                    strict=True,
                ):
                    if mine_ is not None:
                        assert _fields(mine_) == _fields(theirs_)
    # Each VM comes with its own project, never another tenant's.
    with transaction.atomic():
        assert placement.pending_locked(vm.pk).project.slug == "mine"
        assert placement.pending_locked(other.pk).project.slug == "theirs"
        assert placement.pending_locked(other.pk).placement_group is None


def test_it_finds_nothing_where_the_orm_finds_nothing():
    project = _project("solo")
    template = make_template(gpus=1)
    placed, waiting, gone = (make_vm(project, template) for _ in range(3))
    host = make_host("gpu-a")
    VirtualMachine.objects.filter(pk=placed.pk).update(state=VmState.PROVISIONING)
    VirtualMachine.objects.filter(pk=waiting.pk).update(reserved_host=host)
    missing = gone.pk
    VirtualMachine.objects.filter(pk=gone.pk).delete()
    for pk in (placed.pk, waiting.pk, missing):
        with transaction.atomic():
            assert _orm(pk) is None
            assert placement.pending_locked(pk) is None
            assert placement.pending_locked(pk, skip_locked=True) is None


def test_it_locks_the_vm_row_alone_and_skips_a_row_locked_elsewhere():
    project = _project("solo")
    vm = make_vm(project, make_template(gpus=1))
    with second_connection() as other:
        with transaction.atomic():
            assert placement.pending_locked(vm.pk) is not None
            with pytest.raises(Exception, match="could not obtain lock"):
                other.execute(
                    "SELECT id FROM compute_virtualmachine WHERE id = %s FOR UPDATE NOWAIT",
                    [vm.pk],
                )
            # Its project's row is read, not locked.
            other.execute(
                "SELECT id FROM tenants_project WHERE id = %s FOR UPDATE NOWAIT", [project.pk]
            )
            other.execute("ROLLBACK")
        with other.transaction():
            other.execute("SELECT id FROM compute_virtualmachine WHERE id = %s FOR UPDATE", [vm.pk])
            with transaction.atomic():
                assert placement.pending_locked(vm.pk, skip_locked=True) is None
        with transaction.atomic():
            assert placement.pending_locked(vm.pk, skip_locked=True).pk == vm.pk


def _locks_prepared() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'kumo_lock_%%'")
        return cursor.fetchone()[0]


def test_it_runs_prepared_and_again_wherever_the_connection_lost_it():
    project = _project("solo")
    template = make_template(gpus=1)
    first, second = make_vm(project, template), make_vm(project, template)
    for _ in range(2):
        for _ in range(2):
            with transaction.atomic():
                assert placement.pending_locked(first.pk).pk == first.pk
        assert _locks_prepared() == 1
        connection.close()  # a fresh connection prepares it again
    # Lost in the middle of a transaction: the transaction goes on, with both rows locked.
    with second_connection() as other, transaction.atomic():
        assert placement.pending_locked(first.pk).pk == first.pk
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        assert placement.pending_locked(second.pk).pk == second.pk
        assert _locks_prepared() == 1
        for vm in (first, second):
            with pytest.raises(Exception, match="could not obtain lock"):
                other.execute(
                    "SELECT id FROM compute_virtualmachine WHERE id = %s FOR UPDATE NOWAIT",
                    [vm.pk],
                )


# --- pending_claimed: the lock and the claim in one round trip ---------------------------------


def _queued(vm) -> placement.Queued:
    return placement.Queued.of(VirtualMachine.objects.get(pk=vm.pk))


def _held(vm) -> tuple[int, int, int]:
    """What ``vm`` holds: its GPUs, the vCPUs counted on hosts, its open usage intervals."""
    host_vcpus = sum(Host.objects.values_list("vcpus_used", flat=True))
    open_ = UsageRecord.objects.filter(subject_id=str(vm.pk), ended_at__isnull=True).count()
    return Device.objects.filter(vm_id=vm.pk).count(), host_vcpus, open_


def _waiting_vm_and_a_host(gpus=2):
    project = _project("solo")
    vm = make_vm(project, make_template(gpus=gpus))  # no host yet: it waits
    host = make_host("gpu-a")
    placement.view.invalidate()
    placement.view.get()  # this process's view, loaded with the host free
    return vm, host


def test_a_queued_vm_is_locked_and_claimed_in_one_round_trip():
    vm, host = _waiting_vm_and_a_host(gpus=2)
    queued = _queued(vm)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as sent:
            got, chosen = placement.pending_claimed(queued)
        assert len(sent) == 1
        assert got.pk == vm.pk and chosen.host_id == host.pk
        assert (got.state, got.host_id, got.generation) == (
            VmState.PROVISIONING,
            host.pk,
            queued.generation + 1,
        )
        assert got.project.slug == "solo"  # with its related objects, as pending_locked reads
    row = VirtualMachine.objects.get(pk=vm.pk)
    assert (row.state, row.host_id, row.generation) == (
        VmState.PROVISIONING,
        host.pk,
        queued.generation + 1,
    )
    assert _held(vm) == (2, 32, 3)  # its GPUs, its vCPUs, and its bill (GPUs, vCPUs, memory)


@pytest.mark.parametrize(
    "change",
    [{"vcpus": 8}, {"generation": F("generation") + 1}, {"name": "renamed"}],
    ids=["resized", "changed", "renamed"],
)
def test_a_vm_changed_since_the_queue_read_it_is_locked_but_not_claimed(change):
    vm, _host = _waiting_vm_and_a_host()
    queued = _queued(vm)
    VirtualMachine.objects.filter(pk=vm.pk).update(**change)
    with transaction.atomic():
        got, chosen = placement.pending_claimed(queued)
        assert got.pk == vm.pk and chosen is None
        assert got.state == VmState.PENDING and got.host_id is None
        assert _held(vm) == (0, 0, 0)  # the claim made for the VM as it was is undone
        placement.place(got)  # the caller places it as it is now
    assert _held(vm) == (2, got.vcpus, 3)


def test_a_vm_no_longer_pending_is_neither_returned_nor_claimed():
    vm, _host = _waiting_vm_and_a_host()
    queued = _queued(vm)
    # Unplaced at the generation read: only the lock's conditions tell it is not pending.
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.ERROR)
    with transaction.atomic():
        assert placement.pending_claimed(queued) == (None, None)
    assert VirtualMachine.objects.get(pk=vm.pk).state == VmState.ERROR
    assert _held(vm) == (0, 0, 0)


def test_a_vm_another_transaction_holds_is_skipped_without_waiting():
    vm, _host = _waiting_vm_and_a_host()
    queued = _queued(vm)
    with second_connection() as other, other.transaction():
        other.execute("SELECT id FROM compute_virtualmachine WHERE id = %s FOR UPDATE", [vm.pk])
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '5s'")  # waiting would fail the test
            assert placement.pending_claimed(queued) == (None, None)
    assert VirtualMachine.objects.get(pk=vm.pk).state == VmState.PENDING
    assert _held(vm) == (0, 0, 0)


def test_a_claim_that_lost_its_host_writes_nothing_and_the_view_forgets_it(caplog):
    vm, host = _waiting_vm_and_a_host(gpus=8)
    queued = _queued(vm)
    Device.objects.filter(host=host, kind=DeviceKind.GPU).update(present=False)  # gone since
    with transaction.atomic():
        got, chosen = placement.pending_claimed(queued)
        assert got.pk == vm.pk and chosen is None
        assert _held(vm) == (0, 0, 0)
    assert "lost a race" in caplog.text
    with pytest.raises(NoValidHost):  # the view was refreshed: the host has no GPUs now
        placement.view.get().select(placement.request_for(got))


def _seen(scheduler, host) -> tuple:
    """What ``scheduler`` counts free on ``host``: vCPUs, memory and GPUs by cell."""
    view = scheduler.hosts[host.pk]
    cells = {cell: sorted(ids) for cell, ids in view.cells.items()}
    return view.vcpus_free, view.memory_mib_free, cells


def _guarantee_elsewhere():
    """Another project's guaranteed minimum: every on-demand claim has it to weigh."""
    services.guarantee_set(
        project=_project("guaranteed"), min_gpus=1, gpu_model=make_template(gpus=1).gpu_model
    )


def test_a_claim_with_an_admission_to_weigh_gives_back_its_reservation_unread():
    """The claim wrote nothing and the room it counted on held: the view takes back its
    reservation in memory, and is then what a fresh load sees, without reading the host."""
    vm, host = _waiting_vm_and_a_host(gpus=2)
    _guarantee_elsewhere()
    queued = _queued(vm)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as sent:
            got, chosen = placement.pending_claimed(queued)
        assert got.pk == vm.pk and chosen is None
        assert len(sent) == 2  # the lock and the claim, then the claim's undo
        assert _held(vm) == (0, 0, 0)
        assert _seen(placement.view.get(), host) == _seen(placement.load_scheduler(), host)
        placement.place(got)  # weighed, admitted: placed as before
    assert _held(vm) == (2, got.vcpus, 3)


def test_place_weighs_the_admission_without_reading_the_host_again():
    vm, host = _waiting_vm_and_a_host(gpus=2)
    _guarantee_elsewhere()
    with transaction.atomic():
        vm = placement.pending_locked(vm.pk)
        with mock.patch.object(placement, "_host_views", wraps=placement._host_views) as read:
            chosen = placement.place(vm)
        assert chosen.host_id == host.pk and not read.called
    assert _held(vm) == (2, vm.vcpus, 3)
    assert _seen(placement.view.get(), host) == _seen(placement.load_scheduler(), host)


def test_a_claim_with_an_admission_to_weigh_on_a_stale_view_reads_the_host_again():
    """The claim also found the host's GPUs gone: the view was wrong, and is read again."""
    vm, host = _waiting_vm_and_a_host(gpus=8)
    _guarantee_elsewhere()
    queued = _queued(vm)
    Device.objects.filter(host=host, kind=DeviceKind.GPU).update(present=False)  # gone since
    with transaction.atomic():
        got, chosen = placement.pending_claimed(queued)
        assert got.pk == vm.pk and chosen is None
    with pytest.raises(NoValidHost):  # the view was refreshed: the host has no GPUs now
        placement.view.get().select(placement.request_for(got))


def test_it_claims_again_wherever_the_connection_lost_its_statements():
    project = _project("solo")
    template = make_template(gpus=1)
    vms = [make_vm(project, template) for _ in range(5)]
    make_host("gpu-a")
    placement.view.invalidate()
    placement.view.get()
    connection.close()  # a fresh connection: the first claim prepares, the next ones do not
    with transaction.atomic():
        with CaptureQueriesContext(connection) as sent:
            assert placement.pending_claimed(_queued(vms[0]))[1] is not None
        assert "PREPARE" in sent[-1]["sql"]
    queued = _queued(vms[4])
    with transaction.atomic(), CaptureQueriesContext(connection) as sent:
        assert placement.pending_claimed(queued)[1] is not None
    assert len(sent) == 1 and "PREPARE" not in sent[0]["sql"]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")  # lost in the middle of a transaction
        assert placement.pending_claimed(_queued(vms[1]))[1] is not None
    claims._prepared.clear()  # the connection has them, this process does not know
    with transaction.atomic():
        assert placement.pending_claimed(_queued(vms[2]))[1] is not None
    connection.close()  # a fresh connection has none
    with transaction.atomic():
        assert placement.pending_claimed(_queued(vms[3]))[1] is not None
    assert _locks_prepared() == 1
    for vm in vms:
        assert _held(vm)[0] == 1 and _held(vm)[2] == 3


def test_on_a_connection_that_binds_server_side_a_claim_goes_in_one_round_trip(monkeypatch):
    """Kumo's settings have PostgreSQL bind the values and psycopg prepare what runs again
    (``KUMO_DATABASE_PREPARED``, on by default). A claim still sends its savepoints, its
    lock and its statement as one string (``prepared.client_cursor``), and neither a claim
    nor a lost race's undo, which roll back to savepoints, makes psycopg deallocate the
    statements the connection prepared, its own or the claims'."""
    project = _project("solo")
    template = make_template(gpus=1)
    kept, changed, third = (make_vm(project, template) for _ in range(3))
    host = make_host("gpu-a")
    connection.close()
    options = {"server_side_binding": True, "prepare_threshold": 5}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    try:
        placement.view.invalidate()
        placement.view.get()
        assert not isinstance(connection.connection.cursor(), psycopg.ClientCursor)
        for _ in range(6):  # the ORM's statement, prepared by psycopg at its sixth run
            assert Host.objects.filter(pk=host.pk).exists()
        ours = _prepared_by_psycopg()
        assert ours
        queued = _queued(changed)
        VirtualMachine.objects.filter(pk=changed.pk).update(name="renamed")
        sent = []
        with (
            connection.execute_wrapper(lambda run, sql, *a: sent.append(sql) or run(sql, *a)),
            transaction.atomic(),
        ):
            got, chosen = placement.pending_claimed(_queued(kept))
            assert got.pk == kept.pk and chosen is not None
            got, chosen = placement.pending_claimed(queued)
            assert got.pk == changed.pk and chosen is None  # lost: undone
            got, chosen = placement.pending_claimed(_queued(third))
            assert got.pk == third.pk and chosen is not None
            with connection.cursor() as cursor:  # the claim's cached plan was for it alone
                cursor.execute("SHOW plan_cache_mode")
                assert cursor.fetchone() == ("auto",)
        claims_sent = [sql for sql in sent if "EXECUTE kumo_" in sql]
        assert len(claims_sent) == 3 and all("SAVEPOINT" in sql for sql in claims_sent)
        assert any("ROLLBACK TO SAVEPOINT kumo_claim" in sql for sql in sent)
        assert _held(kept)[0::2] == (1, 3)
        assert _held(changed)[0::2] == (0, 0)
        assert ours <= _prepared_by_psycopg()  # nothing deallocated
        assert _locks_prepared() == 1
    finally:
        connection.close()  # the next connection is made with the settings restored


def _prepared_by_psycopg() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE %s", ["_pg3_%"])
        return {name for (name,) in cursor.fetchall()}


@pytest.mark.django_db
def test_a_placed_vm_names_its_host_without_reading_it_and_reads_no_ports_it_lacks(
    project, sent, django_assert_num_queries
):
    """The claim leaves a VM its host as the decision named it (its name, what its host's
    work and its records say; any other field is read when asked for), and a VM created
    without NICs sends its host its work without reading ports or volumes it cannot have
    (made in the same transaction, it has none)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    host = make_host("gpu-a")
    with CaptureQueriesContext(connection) as queries:
        vm, _ = services.vm_create(
            project=project, name="named", template=make_template(gpus=1), image=make_image()
        )
    assert vm.host_id == host.pk
    with django_assert_num_queries(0):
        assert vm.host.name == "gpu-a"
    with django_assert_num_queries(1):
        assert vm.host.state == host.state  # not read with it: read now
    assert not [q for q in queries if 'FROM "network_port"' in q["sql"]]
    assert not [q for q in queries if 'FROM "storage_volume"' in q["sql"]]
    (message,) = [m for m in sent if m[1] == "kumo.host.compute.vm_apply"]
    assert message[0] == "host.gpu-a" and not message[2]["interfaces"]
    assert not message[2]["volumes"]
