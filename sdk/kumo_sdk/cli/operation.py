"""`kumo operation`: the project's asynchronous work (what a 202 answer names: a VM's
create, stop, delete ...), newest first, and waiting for one to finish."""

import itertools
import json as jsonlib
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    Json,
    Timeout,
    Wait,
    command,
    connect,
    current_project,
    group,
    show,
    typed_id,
    wait_operation,
)
from kumo_sdk.errors import OperationFailed
from kumo_sdk.resources.operations import Operations
from kumo_sdk.types import Operation

app = group("The project's operations: asynchronous work (a VM's create, stop ...) and its end.")


def _details(operation: Operation, json: bool) -> None:
    if json:
        return output.emit_json(operation.raw)
    output.fields(
        [
            ("id", operation.id),
            ("kind", operation.kind),
            ("state", operation.state),
            ("object", typed_id(operation.target_type, operation.target_id)),
            ("created", operation.created_at),
            ("updated", operation.updated_at),
            ("deadline", operation.deadline_at),
            ("finished", operation.finished_at),
            ("error", operation.error_message),
            ("error code", operation.error_code),
            ("result", jsonlib.dumps(operation.result, indent=2) if operation.result else None),
        ]
    )
    return None


@command(app, "list")
def operation_list(
    ctx: typer.Context,
    state: Annotated[
        str | None,
        typer.Option(
            metavar="S", help="Only operations in this state: pending, running, succeeded, failed."
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, metavar="N", help="At most N operations, the newest.")
    ] = None,
    json: Json = False,
) -> None:
    """The project's operations, newest first. CREATED is when the API accepted the work
    (an operation records no separate start)."""
    with connect(ctx) as kumo:
        found = kumo.operations.list(project=current_project(kumo), state=state)
        operations = list(itertools.islice(found, limit))
    show(
        operations,
        json,
        ["ID", "KIND", "STATE", "OBJECT", "CREATED", "FINISHED", "ERROR"],
        lambda o: [
            o.id,
            o.kind,
            o.state,
            typed_id(o.target_type, o.target_id),
            o.created_at,
            o.finished_at,
            o.error_message or o.error_code,
        ],
    )


def show_operation(
    operations: Operations,
    operation_id: str,
    *,
    wait: bool,
    timeout: float,
    json: bool,
    project: str | None = None,
) -> None:
    """``operation_id`` read through ``operations`` (the project's, or the operators' view
    of all), or with ``wait`` polled until it finishes; shown. One that failed is shown,
    then raised for ``command`` to report (exit 1)."""
    if not wait:
        operation = operations.get(operation_id, project=project)
    else:
        try:
            operation = wait_operation(
                operations,
                operation_id,
                label=f"operation {operation_id}",
                timeout=timeout,
                project=project,
            )
        except OperationFailed as failed:
            _details(failed.operation, json)
            raise
    _details(operation, json)


@command(app, "show")
def operation_show(
    ctx: typer.Context,
    operation_id: Annotated[str, typer.Argument(help="The operation's id.")],
    wait: Wait = False,
    timeout: Timeout = 600.0,
    json: Json = False,
) -> None:
    """One operation: its object, state, result or error. With --wait, poll until it
    finishes: one that failed is shown, then its error, and the command exits with 1."""
    with connect(ctx) as kumo:
        show_operation(
            kumo.operations,
            operation_id,
            wait=wait,
            timeout=timeout,
            json=json,
            project=current_project(kumo),
        )
