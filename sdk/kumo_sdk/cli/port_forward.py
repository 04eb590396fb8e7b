"""`kumo port-forward`: dNAT port forwards from a global IP to a port."""

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

app = group("DNAT port forwards from a global IP to a port.")


@command(app, "list")
def pf_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's port forwards."""
    with connect(ctx) as kumo:
        forwards = list(kumo.port_forwards.list(project=current_project(kumo)))
    if json:
        return output.emit_json([f.raw for f in forwards])
    output.table(
        ["ID", "GLOBAL IP", "PROTOCOL", "EXTERNAL PORT", "TO PORT", "INTERNAL PORT"],
        [
            [f.id, f.global_ip, f.protocol, f.external_port, f.port, f.internal_port]
            for f in forwards
        ],
    )


@command(app, "create")
def pf_create(
    ctx: typer.Context,
    address: Annotated[str, typer.Argument(help="One of the project's global IPs.")],
    external_port: Annotated[int, typer.Option(help="The port on the global IP.")],
    internal_port: Annotated[int, typer.Option(help="The port on the VM.")],
    protocol: Annotated[str, typer.Option(help="tcp or udp.")] = "tcp",
    port: PortOpt = None,
    vm: VmOpt = None,
    description: str = "",
    json: Json = False,
) -> None:
    """Forward ADDRESS:EXTERNAL_PORT to a port (--port, or --vm for a VM's first NIC)."""
    with connect(ctx) as kumo:
        forward = kumo.port_forwards.create(
            address,
            project=current_project(kumo),
            protocol=protocol,
            external_port=external_port,
            port=target_port(kumo, port, vm),
            internal_port=internal_port,
            description=description,
        )
    if json:
        return output.emit_json(forward.raw)
    output.note(
        f"Forward {forward.id}: {forward.global_ip}:{forward.external_port}/{forward.protocol}"
        f" -> port {forward.port}:{forward.internal_port}."
    )


@command(app, "delete")
def pf_delete(ctx: typer.Context, forward_id: int) -> None:
    """Delete a port forward by id."""
    with connect(ctx) as kumo:
        kumo.port_forwards.delete(forward_id, project=current_project(kumo))
    output.note(f"Port forward {forward_id} deleted.")
