"""controlplane/services.py: operations are created, started, finished once, and reaped."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane import services
from controlplane.choices import AuditOutcome, AuditSource, OperationState
from controlplane.models import AuditEvent, Operation
from tenants.choices import Role

pytestmark = pytest.mark.django_db


def _operation(project, **kwargs):
    return services.operation_create(
        kind="test.work", target=project, project=project, created_by=project.owner, **kwargs
    )


def _finish_events(operation):
    return AuditEvent.objects.filter(action="test.work.finish", object_id=str(operation.pk))


def test_operation_create_records_target_and_deadline(project, settings):
    settings.OPERATION_DEADLINE_S = 120
    before = timezone.now()
    operation = _operation(project)
    assert (operation.state, operation.target_type, operation.target_id) == (
        OperationState.PENDING,
        "tenants.project",
        str(project.pk),
    )
    assert operation.created_by == project.owner
    assert before + timedelta(seconds=120) <= operation.deadline_at
    assert operation.deadline_at <= timezone.now() + timedelta(seconds=120)
    assert _operation(project, deadline_s=5).deadline_at < operation.deadline_at


def test_operation_start_moves_pending_to_running_once(project):
    operation = _operation(project)
    assert services.operation_start(operation_id=operation.pk) is True
    assert services.operation_start(operation_id=operation.pk) is False
    assert Operation.objects.get(pk=operation.pk).state == OperationState.RUNNING


def test_operation_finish_is_idempotent(project):
    operation = _operation(project)
    services.operation_start(operation_id=operation.pk)
    done = services.operation_finish(operation_id=operation.pk, ok=True, result={"ip": "10.0.0.5"})
    assert done.state == OperationState.SUCCEEDED
    assert done.result == {"ip": "10.0.0.5"}
    snapshot = Operation.objects.filter(pk=operation.pk).values().get()

    # a second report (a redelivered message), even a contradicting one, changes nothing
    again = services.operation_finish(
        operation_id=operation.pk, ok=False, error_code="boom", error_message="late failure"
    )
    assert again.pk == operation.pk
    assert Operation.objects.filter(pk=operation.pk).values().get() == snapshot

    event = _finish_events(operation).get()
    assert (event.outcome, event.source, event.actor) == (
        AuditOutcome.SUCCESS,
        AuditSource.CONTROLLER,
        None,
    )
    assert event.project == project


def test_a_failed_operation_keeps_its_error_and_audits_it(project):
    operation = _operation(project)
    services.operation_finish(
        operation_id=operation.pk, ok=False, error_code="x" * 100, error_message="disk full"
    )
    operation.refresh_from_db()
    assert operation.state == OperationState.FAILED
    assert operation.error_code == "x" * 64  # cut to the column
    assert operation.error_message == "disk full"
    assert operation.finished_at is not None
    event = _finish_events(operation).get()
    assert event.outcome == AuditOutcome.FAILED
    assert event.detail["error"] == "disk full"


def test_finishing_an_unknown_operation_does_nothing():
    before = AuditEvent.objects.count()
    assert services.operation_finish(operation_id=uuid.uuid4(), ok=True) is None
    assert AuditEvent.objects.count() == before


def test_reaper_fails_only_unfinished_operations_past_their_deadline(project):
    overdue_pending = _operation(project, deadline_s=1)
    overdue_running = _operation(project, deadline_s=1)
    services.operation_start(operation_id=overdue_running.pk)
    in_time = _operation(project, deadline_s=3600)
    finished = _operation(project, deadline_s=1)
    services.operation_finish(operation_id=finished.pk, ok=True)

    later = timezone.now() + timedelta(seconds=5)
    assert services.operations_reap(now=later) == 2
    for operation in (overdue_pending, overdue_running):
        operation.refresh_from_db()
        assert operation.state == OperationState.FAILED
        assert operation.error_code == "deadline_exceeded"
        assert _finish_events(operation).get().outcome == AuditOutcome.FAILED
    in_time.refresh_from_db()
    finished.refresh_from_db()
    assert in_time.state == OperationState.PENDING
    assert finished.state == OperationState.SUCCEEDED
    assert finished.error_code == ""

    # nothing left to reap: a second pass changes nothing
    events = AuditEvent.objects.count()
    assert services.operations_reap(now=later) == 0
    assert AuditEvent.objects.count() == events


def test_reaper_with_nothing_overdue(project):
    operation = _operation(project)
    assert services.operations_reap() == 0
    operation.refresh_from_db()
    assert operation.state == OperationState.PENDING


def test_members_poll_their_operations(client_for, users_by_role, project):
    operation = _operation(project)
    client = client_for(users_by_role[Role.READER])
    response = client.get(f"/api/v1/projects/{project.slug}/operations/{operation.pk}/")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "pending"
    assert body["url"].endswith(f"/api/v1/projects/{project.slug}/operations/{operation.pk}/")
    services.operations_reap(now=timezone.now() + timedelta(days=1))
    body = client.get(response.json()["url"]).json()
    assert (body["state"], body["error_code"]) == ("failed", "deadline_exceeded")


def test_operators_see_every_operation_non_staff_get_403(client_for, staff, project):
    operation = _operation(project)
    response = client_for(staff).get("/api/v1/admin/operations/", {"kind": "test.work"})
    assert response.status_code == 200
    assert [op["id"] for op in response.json()["results"]] == [str(operation.pk)]
    assert client_for(project.owner).get("/api/v1/admin/operations/").status_code == 403


@pytest.mark.postgres
def test_a_vms_current_operation_is_read_by_its_target_not_by_the_clouds_history(
    project, django_assert_num_queries
):
    """``current_operation`` runs at every report of a VM's host: it reads the VM's own
    operations by the target index, whatever the failed operations of every other VM."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from compute.services.lifecycle import current_operation
    from tests.factories import make_vm

    vm = make_vm(project)
    later = timezone.now() + timedelta(hours=1)
    Operation.objects.bulk_create(
        Operation(
            kind="vm.start", target_type="compute.virtualmachine", target_id=str(uuid.uuid4()),
            state=OperationState.FAILED, error_code="deadline_exceeded", deadline_at=later,
        )
        for _ in range(3000)
    )  # fmt: skip
    opened = services.operation_create(kind="vm.stop", target=vm, project=project)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE controlplane_operation")
    with CaptureQueriesContext(connection) as read, django_assert_num_queries(1):
        assert current_operation(vm) == str(opened.pk)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + read.captured_queries[0]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "operation_target_at" in plan, plan
