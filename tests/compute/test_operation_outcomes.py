"""Every operation ends in a state that is true, promptly (issue 13, fault 4): a VM deleted
before it launched supersedes its create at once; a late success overturns a deadline
failure, and the operation says both."""

from datetime import timedelta

import pytest
from django.utils import timezone

from compute import services
from compute.choices import VmState
from compute.services.lifecycle import current_operation
from controlplane.models import Operation
from controlplane.services import operations_reap
from tests.compute.test_vms import fresh
from tests.factories import make_host, make_image, make_template

pytestmark = pytest.mark.django_db


def _create(project):
    return services.vm_create(
        project=project, name="op-vm", template=make_template(), image=make_image()
    )


def _observed(vm, power, operation_id, generation=None):
    return services.vm_observed(
        host=vm.host.name,
        payload={
            "vm_id": str(vm.pk),
            "generation": generation or vm.generation,
            "power": power,
            "ok": True,
            "operation_id": operation_id,
        },
        sent_at=timezone.now(),
    )


def test_a_vm_deleted_before_it_launched_supersedes_its_create_at_once(project, sent):
    make_host()
    vm, create = _create(project)
    assert vm.state == VmState.PROVISIONING
    vm, delete = services.vm_delete(vm=fresh(vm))
    create.refresh_from_db()
    assert create.state == "failed" and create.error_code == "superseded"
    assert create.finished_at is not None
    # The delete is the operation the host's answer finishes.
    assert current_operation(vm) == str(delete.pk)
    services.guests_reported(host=vm.host.name, payload={"guests": []}, sent_at=timezone.now())
    delete.refresh_from_db()
    assert delete.state == "succeeded"
    assert Operation.objects.filter(state__in=["pending", "running"]).count() == 0


def test_a_late_success_overturns_a_deadline_failure_and_says_both(project, sent):
    make_host()
    vm, create = _create(project)
    # The controller was down past the deadline: the reaper failed the create.
    assert operations_reap(now=timezone.now() + timedelta(hours=1)) == 1
    create.refresh_from_db()
    assert (create.state, create.error_code) == ("failed", "deadline_exceeded")
    # Then the host's answer arrives: the guest runs.
    _observed(vm, "running", str(create.pk))
    create.refresh_from_db()
    assert create.state == "succeeded" and create.error_code == ""
    assert "deadline_exceeded_at" in create.result
    assert fresh(vm).state == VmState.RUNNING


def test_the_reconcile_finishes_a_reaped_operation_when_the_guest_shows_up(project, sent):
    host = make_host()
    vm, create = _create(project)
    operations_reap(now=timezone.now() + timedelta(hours=1))
    guest = {"vm_id": str(vm.pk), "generation": vm.generation, "power": "running"}
    services.guests_reported(host=host.name, payload={"guests": [guest]}, sent_at=timezone.now())
    create.refresh_from_db()
    assert create.state == "succeeded" and "deadline_exceeded_at" in create.result


def test_a_real_failure_stays_failed(project, sent):
    make_host()
    vm, create = _create(project)
    services.vm_observed(
        host=vm.host.name,
        payload={
            "vm_id": str(vm.pk),
            "generation": vm.generation,
            "power": "unknown",
            "ok": False,
            "error": "no such image",
            "operation_id": str(create.pk),
        },
        sent_at=timezone.now(),
    )
    _observed(fresh(vm), "running", str(create.pk))
    create.refresh_from_db()
    assert create.state == "failed" and create.error_message == "no such image"


@pytest.mark.django_db(transaction=True)  # the report's own transaction, not a savepoint
def test_a_report_finishes_its_operation_without_a_savepoint(project, sent):
    """The operation is finished inside the report's transaction: no savepoint of its own
    (two round trips less for every report that finishes one), and a failure in it rolls
    the whole report back, the VM's state with it."""
    from unittest import mock

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make_host()
    vm, create = _create(project)
    with CaptureQueriesContext(connection) as queries:
        _observed(vm, "running", str(create.pk))
    assert not [q["sql"] for q in queries if "SAVEPOINT" in q["sql"].upper()]
    create.refresh_from_db()
    assert create.state == "succeeded" and fresh(vm).state == VmState.RUNNING

    vm, stop = services.vm_stop(vm=fresh(vm))
    failing = mock.patch("controlplane.audit.record", side_effect=RuntimeError("audit down"))
    with failing, pytest.raises(RuntimeError):
        _observed(vm, "shutoff", str(stop.pk))
    stop.refresh_from_db()
    assert stop.state != "succeeded" and fresh(vm).state == VmState.RUNNING


def test_a_boot_report_reads_no_bill_and_writes_its_records_in_one_statement(project, sent):
    """A guest seen running moves its VM from provisioning to running, which bills what it
    billed: its usage intervals are neither read nor written. Its operation is finished and
    read back by one UPDATE, and the VM's record and the operation's are one INSERT; both
    name the project. A deletion's report likewise writes its two records at once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.models import AuditEvent
    from tenants.models import UsageRecord

    make_host()
    vm, create = _create(project)
    intervals = UsageRecord.objects.filter(subject_id=str(vm.pk)).values_list("pk", "ended_at")
    billed = list(intervals)
    with CaptureQueriesContext(connection) as queries:
        _observed(vm, "running", str(create.pk))
    sql = [q["sql"] for q in queries]
    assert not [s for s in sql if "tenants_usagerecord" in s]
    assert len([s for s in sql if "controlplane_operation" in s]) == 1
    assert len([s for s in sql if s.startswith('INSERT INTO "controlplane_auditevent"')]) == 1
    assert list(intervals.all()) == billed
    create.refresh_from_db()
    assert create.state == "succeeded" and fresh(vm).state == VmState.RUNNING
    records = AuditEvent.objects.filter(object_id__in=[str(vm.pk), str(create.pk)]).order_by("pk")
    assert [(r.action, r.project_slug) for r in records][-2:] == [
        ("vm.state", project.slug),
        ("vm.create.finish", project.slug),
    ]

    vm, delete = services.vm_delete(vm=fresh(vm))
    with CaptureQueriesContext(connection) as queries:
        _observed(vm, "absent", str(delete.pk))
    inserts = [q for q in queries if q["sql"].startswith('INSERT INTO "controlplane_auditevent"')]
    assert len(inserts) == 1
    assert fresh(vm).state == VmState.DELETED
    assert list(
        AuditEvent.objects.filter(object_id__in=[str(vm.pk), str(delete.pk)])
        .order_by("-pk")
        .values_list("action", flat=True)[:2]
    ) == ["vm.delete.finish", "vm.deleted"]
    assert not UsageRecord.objects.filter(subject_id=str(vm.pk), ended_at__isnull=True).exists()
