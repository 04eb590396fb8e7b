"""``placement.pending_locked``, the read a scheduler makes before it places a VM: on
PostgreSQL its SQL is compiled once and runs prepared, and it answers exactly what the ORM's
query answers (every column, the same related objects, None where the ORM finds nothing),
with the VM's row locked and nobody else's."""

import pytest
from django.db import connection, transaction

from compute import placement, services
from compute.choices import VmState
from compute.models import VirtualMachine
from tenants import services as tenants
from tests.factories import make_host, make_project, make_template, make_vm
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
