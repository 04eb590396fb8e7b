"""`kumo invoice`: the project's monthly invoices."""

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    Json,
    command,
    connect,
    current_project,
    group,
)

app = group("The project's monthly invoices.")


@command(app, "list")
def invoice_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's invoices."""
    with connect(ctx) as kumo:
        invoices = list(kumo.invoices.list(project=current_project(kumo)))
    if json:
        return output.emit_json([i.raw for i in invoices])
    output.table(
        ["ID", "PERIOD", "CURRENCY", "TOTAL", "POINTS", "DUE", "ISSUED"],
        [
            [
                i.id,
                f"{i.period_start:%Y-%m}",
                i.currency,
                i.total,
                i.points_applied,
                i.amount_due,
                i.issued_at,
            ]
            for i in invoices
        ],
    )


class InvoiceFormat(StrEnum):
    csv = "csv"
    json = "json"


# ``kumo invoice download`` and ``kumo admin invoice download`` take the same arguments.
InvoiceId = Annotated[int, typer.Argument(metavar="ID", help="The invoice's id.")]
FormatOpt = Annotated[
    InvoiceFormat, typer.Option("--format", help="csv, or json (its canonical document).")
]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write to this file, not stdout.")
]


def emit_download(invoice_id: int, body: bytes, out: Path | None) -> None:
    """An invoice's bytes to standard output, or to ``out`` with a note of what was written."""
    if out is None:
        typer.echo(body.decode("utf-8"), nl=not body.endswith(b"\n"))
        return
    out.write_bytes(body)
    output.note(f"Invoice {invoice_id} written to {out} ({len(body)} bytes).")


@command(app, "download")
def invoice_download(
    ctx: typer.Context,
    invoice_id: InvoiceId,
    format: FormatOpt = InvoiceFormat.csv,
    out: OutputOpt = None,
) -> None:
    """Download an invoice as CSV or JSON, to standard output or a file."""
    with connect(ctx) as kumo:
        body = kumo.invoices.download(
            invoice_id, format=format.value, project=current_project(kumo)
        )
    emit_download(invoice_id, body, out)
