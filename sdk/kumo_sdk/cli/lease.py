"""`kumo lease`: the project's reservations of GPUs over a period."""

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("Leases: GPUs reserved for the project over a period (its VMs run in them).")

COLUMNS = ["ID", "NAME", "GPUS", "STARTS", "ENDS", "STATE"]


def _size(lease) -> str:
    """``8 x A100``, or ``2 hosts (16 x A100)`` for a lease of whole hosts."""
    gpus = f"{lease.gpus} x {lease.gpu_model}"
    return gpus if lease.hosts is None else f"{lease.hosts} hosts ({gpus})"


def _row(lease):
    return [
        lease.id,
        lease.name,
        _size(lease),
        f"{lease.starts_at:%Y-%m-%d %H:%M}",
        f"{lease.ends_at:%Y-%m-%d %H:%M}",
        lease.state,
    ]


def _when(value: str) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or ``now``."""
    if value == "now":
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 time (2026-12-01T09:00)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _hours(value: str) -> timedelta:
    try:
        return timedelta(hours=float(value))
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a number of hours") from None


@command(app, "list")
def lease_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's leases, soonest first."""
    with connect(ctx) as kumo:
        leases = list(kumo.leases.list(project=current_project(kumo)))
    show(leases, json, COLUMNS, _row)


@command(app, "create")
def lease_create(
    ctx: typer.Context,
    name: str,
    start: Annotated[str, typer.Option(help="ISO 8601 time (UTC unless it says), or now.")],
    hours: Annotated[str, typer.Option(help="How long, in hours.")],
    gpus: Annotated[int | None, typer.Option(help="How many GPUs, on any hosts.")] = None,
    hosts: Annotated[
        int | None, typer.Option(help="How many whole hosts (every GPU of each), not --gpus.")
    ] = None,
    gpu_model: Annotated[str, typer.Option(help="The GPU model (the fleet's one if empty).")] = "",
    lend_idle: Annotated[
        bool,
        typer.Option(
            help="Let spot VMs run on the GPUs its VMs leave idle while it is active (a VM "
            "of the lease then waits up to one spot eviction notice for them)."
        ),
    ] = True,
    json: Json = False,
) -> None:
    """Reserve GPUs, or whole hosts (project admins). When they do not fit, the answer names
    the earliest period that does."""
    begin = _when(start)
    with connect(ctx) as kumo:
        made = kumo.leases.create(
            name,
            gpus=gpus,
            hosts=hosts,
            starts_at=begin,
            ends_at=begin + _hours(hours),
            gpu_model=gpu_model,
            lend_idle=lend_idle,
            project=current_project(kumo),
        )
    if json:
        return output.emit_json(made.raw)
    output.note(
        f"Lease {made.name}: {_size(made)} from {made.starts_at:%Y-%m-%d %H:%M} "
        f"to {made.ends_at:%Y-%m-%d %H:%M} UTC ({made.state}). Create VMs in it with "
        f"`kumo vm create ... --lease {made.name}`."
    )
    return None


# ``kumo lease update`` and ``kumo admin lease-update``: whether a lease lends its idle GPUs,
# when it ends and how many GPUs it holds.
LendIdle = Annotated[
    bool | None,
    typer.Option(
        "--lend-idle/--no-lend-idle",
        help="Lend its idle GPUs to spot VMs, or keep them idle for its VMs (the spot "
        "VMs borrowing them get their eviction notice now).",
    ),
]
Start = Annotated[
    str | None,
    typer.Option(
        help="Start it then instead (before it holds GPUs): an ISO 8601 time, or now. It "
        "keeps its length unless --ends says when it ends."
    ),
]
Ends = Annotated[
    str | None,
    typer.Option(
        help="End it then instead: an ISO 8601 time (UTC unless it says). Later is admitted "
        "again for the time it adds; when that does not fit, the answer names the latest "
        "end that does."
    ),
]
Extend = Annotated[
    str | None,
    typer.Option(help="Move its end by this many hours (negative: earlier), not --ends."),
]
Gpus = Annotated[
    int | None,
    typer.Option(
        help="Hold this many GPUs from now on: more are held at once if the fleet has them "
        "(the answer names the most that fit otherwise); fewer let go of GPUs its VMs do "
        "not use."
    ),
]


def changes_said(
    lend_idle: bool | None,
    start: str | None,
    ends: str | None,
    extend: str | None,
    gpus: int | None,
    lease,
) -> dict:
    """The fields ``kumo lease update`` was told to change on ``lease`` (as the API has
    it now; read only for ``start`` and ``extend``); a usage error when it was told none,
    or two ways to say the end."""
    if ends is not None and extend is not None:
        raise typer.BadParameter("say --ends or --extend, not both", param_hint="ends")
    if start is not None and extend is not None:
        raise typer.BadParameter("with --start, say the end with --ends", param_hint="extend")
    fields: dict = {}
    if lend_idle is not None:
        fields["lend_idle"] = lend_idle
    if start is not None:
        fields["starts_at"] = _when(start)
        fields["ends_at"] = fields["starts_at"] + (lease.ends_at - lease.starts_at)
    if ends is not None:
        fields["ends_at"] = _when(ends)
    if extend is not None:
        fields["ends_at"] = lease.ends_at + _hours(extend)
    if gpus is not None:
        fields["gpus"] = gpus
    if not fields:
        raise typer.BadParameter(
            "say --lend-idle or --no-lend-idle, --start, --ends or --extend, or --gpus",
            param_hint="lend_idle",
        )
    return fields


def lease_changed(done, name: str, fields: dict, json: bool) -> None:
    """Say what lease ``done`` (named ``name``) now does, for each of ``fields`` changed."""
    if json:
        return output.emit_json(done.raw)
    if "lend_idle" in fields:
        output.note(
            f"Lease {name} lends its idle GPUs to spot VMs."
            if done.lend_idle
            else f"Lease {name} keeps its idle GPUs for its VMs."
        )
    if "starts_at" in fields:
        output.note(
            f"Lease {name} runs from {done.starts_at:%Y-%m-%d %H:%M} "
            f"to {done.ends_at:%Y-%m-%d %H:%M} UTC."
        )
    elif "ends_at" in fields:
        output.note(f"Lease {name} ends at {done.ends_at:%Y-%m-%d %H:%M} UTC.")
    if "gpus" in fields:
        output.note(f"Lease {name} holds {_size(done)}.")
    return None


@command(app, "update")
def lease_update(
    ctx: typer.Context,
    name: str,
    lend_idle: LendIdle = None,
    start: Start = None,
    ends: Ends = None,
    extend: Extend = None,
    gpus: Gpus = None,
    json: Json = False,
):
    """Change a lease (project admins): whether it lends its idle GPUs to spot VMs, when it
    starts (before it holds GPUs) and ends, how many GPUs it holds."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = kumo.leases.find(name, project=project)
        fields = changes_said(lend_idle, start, ends, extend, gpus, found)
        done = kumo.leases.update(found.id, project=project, **fields)
    return lease_changed(done, done.name, fields, json)


@command(app, "cancel")
def lease_cancel(ctx: typer.Context, name: str) -> None:
    """Cancel a lease: not started, it is billed nothing; started, it ends now and its VMs
    are shelved."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = kumo.leases.find(name, project=project)
        done = kumo.leases.cancel(found.id, project=project)
    output.note(f"Lease {done.name} is {done.state}.")
