"""`kumo global-ip`: global IP addresses: 1:1 NAT to a port, or port forwards."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    Json,
    PortOpt,
    VmOpt,
    command,
    connect,
    current_project,
    group,
    target_port,
)

app = group("Global IP addresses: 1:1 NAT to a port, or port forwards.")


@command(app, "list")
def gip_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's global IPs (the router's own is marked)."""
    with connect(ctx) as kumo:
        addresses = list(kumo.global_ips.list(project=current_project(kumo)))
    if json:
        return output.emit_json([a.raw for a in addresses])
    output.table(
        ["ID", "ADDRESS", "POOL", "PORT", "ROUTER", "DESCRIPTION"],
        [[a.id, a.address, a.pool, a.port, a.router, a.description] for a in addresses],
    )


@command(app, "allocate")
def gip_allocate(ctx: typer.Context, description: str = "", json: Json = False) -> None:
    """Take a new global IP for the project."""
    with connect(ctx) as kumo:
        address = kumo.global_ips.allocate(project=current_project(kumo), description=description)
    if json:
        return output.emit_json(address.raw)
    output.out.print(address.address, markup=False)


@command(app, "release")
def gip_release(ctx: typer.Context, address: str) -> None:
    """Give a global IP back (its port forwards go with it)."""
    with connect(ctx) as kumo:
        found = kumo.global_ips.find(address, project=current_project(kumo))
        kumo.global_ips.release(found.id)
    output.note(f"{address} released.")


@command(app, "associate")
def gip_associate(
    ctx: typer.Context,
    address: str,
    port: PortOpt = None,
    vm: VmOpt = None,
    none: Annotated[bool, typer.Option("--none", help="Dissociate it.")] = False,
    json: Json = False,
) -> None:
    """1:1 NAT a global IP to a port (--port, or --vm for a VM's first NIC); --none undoes it."""
    with connect(ctx) as kumo:
        found = kumo.global_ips.find(address, project=current_project(kumo))
        target = None if none else target_port(kumo, port, vm)
        updated = kumo.global_ips.associate(found.id, target)
    if json:
        return output.emit_json(updated.raw)
    output.note(
        f"{address} now NATs to port {updated.port}." if updated.port else f"{address} is free."
    )
