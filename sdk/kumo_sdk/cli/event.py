"""`kumo event`: the project's event feed (eviction notices, budget alerts, members
joining, reclamation steps), newest first, as its webhooks receive it.

The API filters events by kind, object id and time (``since``); several kinds are one
list each, merged here."""

import heapq
import itertools
import json as jsonlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show, typed_id
from kumo_sdk.client import Client
from kumo_sdk.types import Event

app = group("The project's events: what happened to it (also sent to its webhooks).")

AGE = re.compile(r"^(\d+)([smhd])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _since(value: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or an age: ``90s``, ``30m``, ``12h``,
    ``7d`` before now."""
    age = AGE.match(value.strip())
    if age:
        return datetime.now(UTC) - timedelta(**{UNITS[age[2]]: int(age[1])})
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is neither an ISO 8601 time (2026-12-01T09:00) nor an age (30m, 12h, 7d)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _feed(
    kumo: Client, project: str, kinds: list[str], object_id: str | None, since: datetime | None
) -> Iterator[Event]:
    """The project's events in the API's order, newest first (``created_at``, then id), of
    ``object_id`` and at or after ``since`` when given. The API takes one kind per request:
    several kinds are one lazy list each, merged in that order."""
    if len(kinds) <= 1:
        kind = kinds[0] if kinds else None
        return kumo.events.list(project=project, kind=kind, object_id=object_id, since=since)
    lists = [
        kumo.events.list(project=project, kind=kind, object_id=object_id, since=since)
        for kind in dict.fromkeys(kinds)
    ]
    return heapq.merge(*lists, key=lambda e: (e.created_at, e.id), reverse=True)


@command(app, "list")
def event_list(
    ctx: typer.Context,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            metavar="KIND",
            help="Only events of exactly this kind (vm.eviction_notice, budget.threshold,"
            " member.joined, ...); repeat for several. An unknown kind matches none.",
        ),
    ] = None,
    object_id: Annotated[
        str | None,
        typer.Option(
            "--object-id",
            metavar="ID",
            help="Only events about the object with exactly this id (a VM's, a budget's, ...:"
            " the OBJECT column's id).",
        ),
    ] = None,
    since: Annotated[
        datetime | None,
        typer.Option(
            metavar="T",
            parser=_since,
            help="Only events recorded at or after T: an ISO 8601 time (UTC unless it names"
            " a zone), or an age such as 30m, 12h or 7d.",
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, metavar="N", help="At most N events, the newest.")
    ] = None,
    json: Json = False,
) -> None:
    """The project's events, newest first."""
    with connect(ctx) as kumo:
        feed = _feed(kumo, current_project(kumo), kind or [], object_id, since)
        events = list(itertools.islice(feed, limit))
    show(
        events,
        json,
        ["TIME", "KIND", "OBJECT", "MESSAGE"],
        lambda e: [e.created_at, e.kind, typed_id(e.object_type, e.object_id), e.message],
    )


@command(app, "show")
def event_show(
    ctx: typer.Context,
    event_id: Annotated[int, typer.Argument(help="The event's id.")],
    json: Json = False,
) -> None:
    """One event, with its payload (what a webhook receives besides the message)."""
    with connect(ctx) as kumo:
        event = kumo.events.get(event_id, project=current_project(kumo))
    if json:
        return output.emit_json(event.raw)
    output.fields(
        [
            ("id", event.id),
            ("time", event.created_at),
            ("kind", event.kind),
            ("object", typed_id(event.object_type, event.object_id)),
            ("message", event.message),
            ("payload", jsonlib.dumps(event.payload, indent=2) if event.payload else None),
        ]
    )
    return None
