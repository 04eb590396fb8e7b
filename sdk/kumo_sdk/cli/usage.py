"""`kumo usage`: the project's usage records and this month's forecast."""

from datetime import datetime
from typing import Annotated, Any

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    Json,
    connect,
    current_project,
)


def usage(
    ctx: typer.Context,
    forecast: Annotated[
        bool, typer.Option("--forecast", help="This month's spend so far and projected.")
    ] = False,
    resource: Annotated[
        str | None, typer.Option(help="Only this resource (vcpu, memory, gpu, ...).")
    ] = None,
    open_: Annotated[bool, typer.Option("--open", help="Only intervals still open.")] = False,
    since: Annotated[
        datetime | None, typer.Option(help="Only intervals started at or after this.")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(help="Only intervals started before this.")
    ] = None,
    json: Json = False,
) -> None:
    """The project's usage records, or with --forecast this month's spend and forecast."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        if forecast:
            report = kumo.usage.forecast(project=project)
        else:
            filters: dict[str, Any] = {
                "resource": resource,
                "open": True if open_ else None,
                "started_after": since,
                "started_before": until,
            }
            records = list(kumo.usage.list(project=project, **filters))
    if forecast:
        if json:
            return output.emit_json(report.raw)
        output.fields(
            [
                ("period", f"{report.period_start} to {report.period_end}"),
                ("so far", f"{report.so_far} {report.currency}"),
                ("projected", f"{report.projected} {report.currency}"),
                ("points", report.points_balance),
                *[
                    (
                        f"budget {b.name}",
                        f"{b.amount}: {b.spent_percent} % spent, {b.projected_percent} % projected",
                    )
                    for b in report.budgets
                ],
            ]
        )
        if report.lines:
            output.table(
                ["RESOURCE", "MODEL", "PRIORITY", "QUANTITY", "UNIT", "UNIT PRICE", "AMOUNT"],
                [
                    [
                        li.resource,
                        li.model,
                        li.priority,
                        li.quantity,
                        li.unit,
                        li.unit_price,
                        li.amount,
                    ]
                    for li in report.lines
                ],
            )
        return None
    if json:
        return output.emit_json([r.raw for r in records])
    output.table(
        ["ID", "RESOURCE", "MODEL", "PRIORITY", "QUANTITY", "SUBJECT", "STARTED", "ENDED"],
        [
            [
                r.id,
                r.resource,
                r.model,
                r.priority,
                r.quantity,
                r.subject_name or f"{r.subject_type} {r.subject_id}",
                r.started_at,
                r.ended_at or "open",
            ]
            for r in records
        ],
    )
