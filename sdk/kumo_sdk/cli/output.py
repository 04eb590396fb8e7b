"""How the CLI prints: rich tables for people, ``--json`` for programs.

JSON goes to standard output exactly as the server sent it (a list for list commands, an
object otherwise), so ``kumo vm list --json | jq`` sees the API's own fields. Messages,
progress and errors go to standard error and never mix into it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def emit_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


def table(columns: list[str], rows: Iterable[Iterable[Any]]) -> None:
    grid = Table(*columns, box=None, pad_edge=False, header_style="bold")
    for row in rows:
        grid.add_row(*(cell(value) for value in row))
    out.print(grid)


def fields(pairs: Iterable[tuple[str, Any]]) -> None:
    """One object as ``name  value`` lines."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, value in pairs:
        grid.add_row(name, cell(value))
    out.print(grid)


def cell(value: Any) -> Text:
    """A value as plain text (never read as rich markup: names may hold brackets)."""
    if value is None or value == "" or value == []:
        return Text("-")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, datetime):
        return Text(value.strftime("%Y-%m-%d %H:%M:%S"))
    if isinstance(value, list):
        return Text(", ".join(str(v) for v in value))
    return Text(str(value))


def note(message: str, style: str | None = None) -> None:
    """A message for people, on standard error, one line each (never wrapped: it may be
    grepped)."""
    err.print(message, style=style, markup=False, soft_wrap=True)
