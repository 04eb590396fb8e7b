"""`kumo external-connection`: L2VPNs, L3 routes and site VPNs to outside networks."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("External connections (L2VPN, L3 route, site VPN), realized once approved.")


@command(app, "list")
def connection_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's external connections and their review state."""
    with connect(ctx) as kumo:
        found = list(kumo.external_connections.list(project=current_project(kumo)))
    show(
        found,
        json,
        ["ID", "NAME", "KIND", "NETWORK", "VLAN", "DESTINATION", "NEXT HOP", "STATE"],
        lambda c: [
            c.id,
            c.name,
            c.kind,
            c.network,
            c.vlan_id,
            c.destination_cidr,
            c.next_hop,
            c.state,
        ],
    )


@command(app, "request")
def connection_request(
    ctx: typer.Context,
    name: str,
    kind: Annotated[str, typer.Option(help="l2vpn, l3_route or site_vpn.")],
    network: Annotated[str | None, typer.Option(help="The project's network it joins.")] = None,
    vlan_id: Annotated[int | None, typer.Option(help="The VLAN (L2VPN).")] = None,
    destination_cidr: Annotated[str | None, typer.Option(help="The route's CIDR (L3).")] = None,
    next_hop: Annotated[str | None, typer.Option(help="The route's next hop (L3).")] = None,
    remote: Annotated[str | None, typer.Option(help="The far end (site VPN).")] = None,
    json: Json = False,
) -> None:
    """Request a connection (project admins); an operator approves it."""
    with connect(ctx) as kumo:
        made = kumo.external_connections.create(
            name,
            kind=kind,
            network=network,
            vlan_id=vlan_id,
            destination_cidr=destination_cidr,
            next_hop=next_hop,
            remote=remote,
            project=current_project(kumo),
        )
    if json:
        return output.emit_json(made.raw)
    output.note(f"External connection {made.name} (id {made.id}) is {made.state}.")
    return None


@command(app, "delete")
def connection_delete(ctx: typer.Context, connection_id: int) -> None:
    """Delete an external connection by id."""
    with connect(ctx) as kumo:
        kumo.external_connections.delete(connection_id, project=current_project(kumo))
    output.note(f"External connection {connection_id} deleted.")
