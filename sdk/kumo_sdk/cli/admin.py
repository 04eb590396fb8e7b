"""`kumo admin`: the operators' commands (staff tokens only): hosts, devices, rate cards,
capacity guarantees, institutional reviewers."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, group, show
from kumo_sdk.cli.lease import LendIdle, lending_changed, lending_said

app = group("Operators only: hosts, devices, rate cards, capacity guarantees, reviewers.")
host_app = group("The fleet's hosts.")
device_app = group("The hosts' PCI devices (GPUs, RDMA functions).")
rate_app = group("Rate card versions.")
guarantee_app = group("Projects' guaranteed GPU minimums.")
app.add_typer(host_app, name="host")
app.add_typer(device_app, name="device")
app.add_typer(rate_app, name="rate-card")
reviewer_app = group(
    "Institutional reviewers: who reviews the applications of one institution's people."
)
app.add_typer(guarantee_app, name="guarantee")
app.add_typer(reviewer_app, name="reviewer")


@command(host_app, "list")
def host_list(ctx: typer.Context, json: Json = False) -> None:
    """Hosts with their state and use."""
    with connect(ctx) as kumo:
        hosts = list(kumo.admin.hosts.list())
    show(
        hosts,
        json,
        ["NAME", "STATE", "ZONE", "RACK", "VCPUS USED", "MEMORY MIB USED", "GPUS FREE"],
        lambda h: [
            h.name,
            h.state + (f" ({h.state_reason})" if h.state_reason else ""),
            h.zone,
            h.rack,
            f"{h.vcpus_used}/{h.vcpus}",
            f"{h.memory_mib_used}/{h.memory_mib}",
            f"{h.gpus_free}/{h.gpus}",
        ],
    )


@command(host_app, "state")
def host_state(
    ctx: typer.Context,
    name: str,
    state: Annotated[str, typer.Argument(help="up (back in service), draining or maintenance.")],
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
) -> None:
    """Drain a host, put it in maintenance, or return it to service."""
    with connect(ctx) as kumo:
        host = kumo.admin.hosts.set_state(name, state, reason=reason)
    output.note(f"Host {host.name} is {host.state}.")


@command(device_app, "list")
def device_list(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Only this host's devices.")] = None,
    json: Json = False,
) -> None:
    """PCI devices and the VM holding each."""
    with connect(ctx) as kumo:
        devices = list(kumo.admin.devices.list(host=host))
    show(
        devices,
        json,
        ["ID", "HOST", "PCI", "KIND", "MODEL", "NUMA", "VM"],
        lambda d: [d.id, d.host, d.pci_address, d.kind, d.model, d.numa_node, d.vm],
    )


@command(rate_app, "list")
def rate_card_list(ctx: typer.Context, json: Json = False) -> None:
    """Rate card versions and their prices."""
    with connect(ctx) as kumo:
        cards = list(kumo.admin.rate_cards.list())
    show(
        cards,
        json,
        ["ID", "VERSION", "FROM", "UNTIL", "CURRENCY", "SPOT", "RESERVED", "PRICES"],
        lambda c: [
            c.id,
            c.version,
            c.valid_from,
            c.valid_until,
            c.currency,
            c.spot_factor,
            c.reserved_factor,
            [f"{p.resource}{' ' + p.model if p.model else ''}: {p.unit_price}" for p in c.prices],
        ],
    )


@command(guarantee_app, "list")
def guarantee_list(ctx: typer.Context, json: Json = False) -> None:
    """Projects with a guaranteed GPU minimum."""
    with connect(ctx) as kumo:
        found = list(kumo.admin.capacity_guarantees.list())
    show(
        found,
        json,
        ["PROJECT", "MIN GPUS", "GPU MODEL", "MIN VCPUS", "UPDATED"],
        lambda g: [g.project, g.min_gpus, g.gpu_model, g.min_vcpus, g.updated_at],
    )


@command(guarantee_app, "set")
def guarantee_set(
    ctx: typer.Context,
    project: str,
    min_gpus: int,
    gpu_model: Annotated[str, typer.Option(help="GPU model (empty: the only one).")] = "",
    min_vcpus: Annotated[int, typer.Option(help="Guaranteed vCPUs.")] = 0,
) -> None:
    """Set a project's guaranteed minimum (0 removes it); refused beyond the fleet."""
    with connect(ctx) as kumo:
        made = kumo.admin.capacity_guarantees.update(
            project, min_gpus=min_gpus, gpu_model=gpu_model, min_vcpus=min_vcpus
        )
    output.note(
        f"Project {made.project} is guaranteed {made.min_gpus} {made.gpu_model} GPUs"
        f" and {made.min_vcpus} vCPUs."
    )


@command(app, "leases")
def lease_calendar(
    ctx: typer.Context,
    days: Annotated[int, typer.Option(help="How many days ahead to show.")] = 30,
    json: Json = False,
) -> None:
    """The fleet's calendar: every project's leases that overlap the next DAYS days."""
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    with connect(ctx) as kumo:
        found = list(
            kumo.admin.leases.list(
                ends_after=now.isoformat(), starts_before=(now + timedelta(days=days)).isoformat()
            )
        )
    show(
        found,
        json,
        ["ID", "PROJECT", "NAME", "GPUS", "STARTS", "ENDS", "STATE"],
        lambda x: [
            x.id,
            x.project,
            x.name,
            f"{x.gpus} x {x.gpu_model}",
            f"{x.starts_at:%Y-%m-%d %H:%M}",
            f"{x.ends_at:%Y-%m-%d %H:%M}",
            x.state,
        ],
    )


@command(app, "lease-update")
def lease_update(
    ctx: typer.Context,
    lease_id: Annotated[int, typer.Argument(help="The lease's ID (`kumo admin leases`).")],
    lend_idle: LendIdle = None,
    json: Json = False,
) -> None:
    """Change any project's lease: whether it lends its idle GPUs to spot VMs."""
    lend_idle = lending_said(lend_idle)
    with connect(ctx) as kumo:
        done = kumo.admin.leases.update(lease_id, lend_idle=lend_idle)
    return lending_changed(done, f"{done.project}/{done.name}", json)


ISSUER_HELP = (
    "The institution's IdP entity ID or OIDC issuer, e.g. "
    "https://idp.example.ac.jp/idp/shibboleth (not its name)."
)


@command(reviewer_app, "list")
def reviewer_list(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="Only this user's designations.")] = None,
    issuer: Annotated[str | None, typer.Option(help="Only this institution's reviewers.")] = None,
    json: Json = False,
) -> None:
    """Institutional reviewers and the issuer each reviews for."""
    with connect(ctx) as kumo:
        rows = list(kumo.admin.institution_reviewers.list(user=user, issuer=issuer))
    show(
        rows,
        json,
        ["ID", "USER", "ISSUER", "BY", "SINCE"],
        lambda r: [r.id, r.user, r.issuer, r.created_by, r.created_at],
    )


@command(reviewer_app, "add")
def reviewer_add(
    ctx: typer.Context,
    username: str,
    issuer: Annotated[str, typer.Argument(help=ISSUER_HELP)],
) -> None:
    """Let USERNAME review the applications of people who log in at ISSUER."""
    with connect(ctx) as kumo:
        row = kumo.admin.institution_reviewers.create(username, issuer)
    output.note(f"{row.user} reviews applications of people of {row.issuer}.")


@command(reviewer_app, "remove")
def reviewer_remove(
    ctx: typer.Context,
    username: str,
    issuer: Annotated[str, typer.Argument(help=ISSUER_HELP)],
) -> None:
    """End USERNAME's reviewing for ISSUER (decisions made stay)."""
    with connect(ctx) as kumo:
        row = kumo.admin.institution_reviewers.remove(username, issuer)
    output.note(f"{row.user} no longer reviews for {row.issuer}.")
