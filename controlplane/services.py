"""Writes to operations (creating them, moving them on, finishing them, reaping stuck ones)
and to projects' webhooks."""

import logging
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane import audit, egress
from controlplane.choices import AuditOutcome, OperationState
from controlplane.compiled import CompiledUpdate, insert
from controlplane.errors import InvalidInput
from controlplane.models import IdempotencyKey, Operation, Webhook
from controlplane.rowjoin import Join, RowLookup, pk_param
from tenants.models import Project

log = logging.getLogger(__name__)


def operation_create(
    *,
    kind: str,
    target,
    project=None,
    created_by=None,
    deadline_s: int | None = None,
) -> Operation:
    """Record accepted asynchronous work. Call inside the transaction that asks for it, and
    dispatch the work with ``transaction.on_commit`` so a worker never sees an uncommitted
    operation. Nearly every action opens one: its INSERT is built once
    (``controlplane.compiled.insert``)."""
    operation = Operation(
        kind=kind,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        project=project,
        created_by=created_by if getattr(created_by, "is_authenticated", False) else None,
        deadline_at=timezone.now() + timedelta(seconds=deadline_s or settings.OPERATION_DEADLINE_S),
    )
    insert(operation)
    return operation


def operation_start(*, operation_id) -> bool:
    """pending → running; False when it already moved on (a repeated message)."""
    return bool(
        Operation.objects.filter(pk=operation_id, state=OperationState.PENDING).update(
            state=OperationState.RUNNING, updated_at=timezone.now()
        )
    )


DEADLINE_EXCEEDED = "deadline_exceeded"


# An operation the reaper failed and a late report finishes is read again, with its project,
# for its audit record: SQL built once per process (``controlplane.rowjoin``), the rows
# ``Operation.objects.select_related("project")`` reads.
_OPERATION = RowLookup(
    Operation,
    joins=[Join("p", Project, 'p."id" = m."project_id"', outer=True)],
    where='m."id" = %s',
    relations=[("m", "project", "p")],
)


# ``operation_finish``'s UPDATE of an open operation, compiled once: every host's answer
# finishes one. Its values in the order of ``fields`` there.
_FINISH = CompiledUpdate(
    lambda pk, state, result, error_code, error_message, finished_at, updated_at: (
        Operation.objects.filter(pk=pk, state__in=[OperationState.PENDING, OperationState.RUNNING]),
        {
            "state": state,
            "result": result,
            "error_code": error_code,
            "error_message": error_message,
            "finished_at": finished_at,
            "updated_at": updated_at,
        },
    ),
    UUID,
    str,
    dict,
    str,
    str,
    datetime,
    datetime,
)


@transaction.atomic(savepoint=False)
def operation_finish(
    *,
    operation_id,
    ok: bool,
    result: dict | None = None,
    error_code: str = "",
    error_message: str = "",
    project: Project | None = None,
) -> Operation | None:
    """Finish an operation once. A second report for a finished operation changes nothing
    (messages can be delivered twice), and so does a report for an unknown id.

    One exception: an operation the reaper failed for its deadline alone takes the outcome
    that arrives late (the work was done after all, or failed for a reason now known), and
    its result keeps ``deadline_exceeded_at``, so it says both.

    Inside a caller's transaction (a host's report finishing the VM's operation) it takes no
    savepoint: nothing catches its failure, which rolls the caller's transaction back
    whole, and a savepoint would cost two more round trips for every finished operation.

    The operation it finishes is read back by its UPDATE (``RETURNING``), and ``project``,
    the caller's object of the operation's project if it has one (the VM's that a host's
    report finishes), stands for the project its audit record names: a finished operation
    costs one statement and its record."""
    now = timezone.now()
    state = OperationState.SUCCEEDED if ok else OperationState.FAILED
    fields = {
        "state": state,
        "result": result or {},
        "error_code": error_code[:64],
        "error_message": error_message,
        "finished_at": now,
        "updated_at": now,
    }
    finished = _FINISH.returning(operation_id, *fields.values())
    if finished:
        operation = finished[0]
        if project is not None and operation.project_id == project.pk:
            operation.project = project
        _audit_finish(operation, ok=ok, error_code=error_code, error_message=error_message)
        return operation
    updated = 0
    if error_code != DEADLINE_EXCEEDED:
        reaped = (
            Operation.objects.filter(
                pk=operation_id, state=OperationState.FAILED, error_code=DEADLINE_EXCEEDED
            )
            .values_list("finished_at", flat=True)
            .first()
        )
        if reaped is not None:
            fields["result"] = {**fields["result"], "deadline_exceeded_at": reaped.isoformat()}
            updated = Operation.objects.filter(
                pk=operation_id, state=OperationState.FAILED, error_code=DEADLINE_EXCEEDED
            ).update(**fields)
    found = _OPERATION.first(pk_param(Operation, operation_id, connection))
    operation = found and found["m"]
    if updated and operation is not None:
        _audit_finish(operation, ok=ok, error_code=error_code, error_message=error_message)
    return operation


def _audit_finish(operation: Operation, *, ok: bool, error_code: str, error_message: str):
    with audit.controller():
        audit.record(
            f"{operation.kind}.finish",
            operation,
            project=operation.project,
            outcome=AuditOutcome.SUCCESS if ok else AuditOutcome.FAILED,
            detail={"error_code": error_code, "error": error_message[:500]} if not ok else {},
        )


def operations_reap(*, now=None) -> int:
    """Fail every operation still unfinished past its deadline; returns how many."""
    now = now or timezone.now()
    stuck = Operation.objects.filter(
        state__in=[OperationState.PENDING, OperationState.RUNNING], deadline_at__lt=now
    ).values_list("pk", flat=True)
    count = 0
    for operation_id in list(stuck):
        if operation_finish(
            operation_id=operation_id,
            ok=False,
            error_code=DEADLINE_EXCEEDED,
            error_message="no result before the deadline; the worker or host may be down",
        ):
            count += 1
    if count:
        log.warning("reaped %d stuck operations", count)
    return count


def idempotency_keys_purge(*, now=None) -> int:
    now = now or timezone.now()
    cutoff = now - timedelta(hours=settings.IDEMPOTENCY_TTL_H)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()
    return deleted


@transaction.atomic
def webhook_create(*, project, url: str, kinds: list[str] | None = None) -> tuple[Webhook, str]:
    """A webhook for ``project``'s events; returns it and its signing secret, which is
    shown this once."""
    import secrets

    try:
        egress.check_saved(url)
    except egress.Refused as e:
        raise InvalidInput.field("url", e.reason) from None
    secret = secrets.token_hex(32)
    hook = Webhook.objects.create(project=project, url=url, secret=secret, kinds=kinds or [])
    audit.record("webhook.create", hook, project=project, detail={"url": url, "kinds": kinds})
    return hook, secret


@transaction.atomic
def webhook_delete(*, webhook: Webhook) -> None:
    audit.record("webhook.delete", webhook, project=webhook.project)
    webhook.delete()
