"""`kumo subnet`: the project's subnets and the DNS servers their guests are told."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import CliError, Json, command, connect, current_project, group

app = group("The project's subnets and their DNS servers.")


@command(app, "list")
def subnet_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's subnets: CIDR, gateway (the network's resolver) and DNS servers."""
    with connect(ctx) as kumo:
        subnets = list(kumo.subnets.list(project=current_project(kumo)))
    if json:
        return output.emit_json([s.raw for s in subnets])
    output.table(
        ["ID", "NETWORK", "CIDR", "GATEWAY", "DNS"],
        [
            [s.id, s.network, s.cidr, s.gateway_ip, s.dns_servers or "the network's resolver"]
            for s in subnets
        ],
    )


@command(app, "set-dns")
def subnet_set_dns(
    ctx: typer.Context,
    subnet: Annotated[str, typer.Argument(help="The subnet's id or CIDR.")],
    server: Annotated[
        list[str] | None,
        typer.Option(metavar="ADDRESS", help="A DNS server (IPv4); repeat, up to 4."),
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Back to the network's own resolver.")
    ] = False,
    json: Json = False,
) -> None:
    """Set the DNS servers a subnet's guests are told (at their VM's next start or
    creation), or --default for the network's own resolver, which answers the project's
    VM names."""
    if bool(server) == default:
        raise CliError("give --server ADDRESS (repeatable) or --default")
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = [s for s in kumo.subnets.list(project=project) if subnet in (str(s.id), s.cidr)]
        if len(found) != 1:
            raise CliError(f"{len(found)} subnets match {subnet!r}: give the id")
        updated = kumo.subnets.update(found[0].id, project=project, dns_servers=server or [])
    if json:
        return output.emit_json(updated.raw)
    told = ", ".join(updated.dns_servers) or f"the network's resolver ({updated.gateway_ip})"
    output.note(f"Subnet {updated.cidr}: guests are told {told}.")
