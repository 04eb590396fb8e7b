"""`kumo quota`: the project's quota, what is used and what is left."""

from dataclasses import fields

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, connect, current_project


def quota(ctx: typer.Context, json: Json = False) -> None:
    """The project's quota: limit, used and available per resource."""
    with connect(ctx) as kumo:
        report = kumo.quota.get(project=current_project(kumo))
    if json:
        return output.emit_json(report.raw)
    output.table(
        ["RESOURCE", "LIMIT", "USED", "AVAILABLE"],
        [
            [f.name, line.limit, line.used, line.available]
            for f in fields(report)
            if (line := getattr(report, f.name)) is not None and f.name != "raw"
        ],
    )
    return None
