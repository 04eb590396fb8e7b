"""`kumo network`: the project's networks."""

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

app = group("The project's networks.")


@command(app, "list")
def network_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's networks and their subnets."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        networks = list(kumo.networks.list(project=project))
        cidrs: dict[str, list[str]] = {}
        if not json:
            for subnet in kumo.subnets.list(project=project):
                cidrs.setdefault(subnet.network, []).append(subnet.cidr)
    if json:
        return output.emit_json([n.raw for n in networks])
    output.table(
        ["NAME", "ID", "KIND", "VNI", "MTU", "SUBNETS", "EXTERNAL"],
        [
            [n.name, n.id, n.kind, n.vni, n.mtu, cidrs.get(n.name, []), n.external_access]
            for n in networks
        ],
    )


@command(app, "create")
def network_create(
    ctx: typer.Context,
    name: str,
    cidr: Annotated[str, typer.Option(help="A first subnet, e.g. 10.0.0.0/24.")] = "",
    external_access: Annotated[
        bool, typer.Option("--external-access", help="SNAT to the outside via the router.")
    ] = False,
    description: str = "",
    json: Json = False,
) -> None:
    """Create a network (an isolated VXLAN segment)."""
    with connect(ctx) as kumo:
        network = kumo.networks.create(
            name,
            project=current_project(kumo),
            cidr=cidr,
            external_access=external_access,
            description=description,
        )
    if json:
        return output.emit_json(network.raw)
    output.note(f"Network {network.name} created: VNI {network.vni}, MTU {network.mtu}.")


@command(app, "delete")
def network_delete(
    ctx: typer.Context, network: Annotated[str, typer.Argument(help="Name or id.")]
) -> None:
    """Delete a network without ports."""
    with connect(ctx) as kumo:
        found = kumo.networks.find(network, project=current_project(kumo))
        kumo.networks.delete(found.id)
    output.note(f"Network {found.name} deleted.")
