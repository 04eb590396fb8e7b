"""`kumo template`: vM sizes on offer."""

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    Json,
    command,
    connect,
    group,
)

app = group("VM sizes on offer.")


@command(app, "list")
def template_list(ctx: typer.Context, json: Json = False) -> None:
    """Templates (VM sizes) on offer."""
    with connect(ctx) as kumo:
        templates = list(kumo.templates.list())
    if json:
        return output.emit_json([t.raw for t in templates])
    output.table(
        ["NAME", "VCPUS", "MEMORY GIB", "GPUS", "DISK GIB", "SPOT", "DESCRIPTION"],
        [
            [
                t.name,
                t.vcpus,
                t.memory_gib,
                f"{t.gpus} x {t.gpu_model}" if t.gpus else 0,
                t.disk_gib,
                t.spot_allowed,
                t.description,
            ]
            for t in templates
        ],
    )
