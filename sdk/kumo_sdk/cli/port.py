"""`kumo port`: the project's ports (VM NICs and ports of their own), their security groups
and port security."""

from typing import Annotated, Any

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    CliError,
    Json,
    VmOpt,
    command,
    connect,
    current_project,
    group,
    target_port,
)
from kumo_sdk.types import Port

app = group("The project's ports: VM NICs and ports of their own.")


@command(app, "list")
def port_list(
    ctx: typer.Context,
    network: Annotated[
        str | None, typer.Option("--network", help="Only this network's ports (name or id).")
    ] = None,
    vm: Annotated[
        str | None, typer.Option("--vm", help="Only this VM's NICs (name or id).")
    ] = None,
    json: Json = False,
) -> None:
    """The project's ports, with their addresses, security groups and port security."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        # The API lists a project's ports unfiltered: the filters are applied here, on names
        # resolved first, so a misspelt network or VM is an error rather than an empty table.
        network_name = kumo.networks.find(network, project=project).name if network else None
        vm_id = kumo.vms.find(vm, project=project).id if vm else None
        ports = [
            p
            for p in kumo.ports.list(project=project)
            if network_name in (None, p.network) and vm_id in (None, p.vm)
        ]
        vm_names = {} if json else {v.id: v.name for v in kumo.vms.list(project=project)}
    if json:
        return output.emit_json([p.raw for p in ports])
    output.table(
        ["ID", "NAME", "NETWORK", "VM", "MAC", "ADDRESSES", "SECURITY GROUPS", "PORT SECURITY"],
        [
            [
                p.id,
                p.name,
                p.network,
                vm_names.get(p.vm, p.vm) if p.vm else None,
                p.mac,
                p.fixed_ips,
                p.security_groups,
                p.port_security,
            ]
            for p in ports
        ],
    )
    return None


def _changes(
    security_group: list[str] | None,
    no_security_groups: bool,
    port_security: bool | None,
    name: str | None,
) -> dict[str, Any]:
    """The fields the command was told to change, and only those (a PATCH keeps the rest)."""
    if security_group and no_security_groups:
        raise CliError("give --security-group or --no-security-groups, not both")
    changes: dict[str, Any] = {}
    if security_group or no_security_groups:
        changes["security_groups"] = security_group or []
    if port_security is not None:
        changes["port_security"] = port_security
    if name is not None:
        changes["name"] = name
    if not changes:
        raise CliError(
            "nothing to change: give --security-group G (repeatable), --no-security-groups,"
            " --port-security/--no-port-security or --name N"
        )
    return changes


def _summary(port: Port) -> str:
    groups = ", ".join(port.security_groups) or "none"
    security = "on" if port.port_security else "off"
    return f"Port {port.id}: security groups {groups}; port security {security}."


@command(app, "update")
def port_update(
    ctx: typer.Context,
    port_id: Annotated[
        str | None, typer.Argument(metavar="PORT_ID", help="The port's id (or give --vm).")
    ] = None,
    vm: VmOpt = None,
    security_group: Annotated[
        list[str] | None,
        typer.Option(
            "--security-group",
            metavar="GROUP",
            help="A security group by name; repeat for several. Replaces the port's groups.",
        ),
    ] = None,
    no_security_groups: Annotated[
        bool,
        typer.Option(
            "--no-security-groups",
            help="Take the port out of every group (with port security on, it then allows"
            " no new flow).",
        ),
    ] = False,
    port_security: Annotated[
        bool | None,
        typer.Option(
            "--port-security/--no-port-security",
            help="Filter the port's traffic (its groups' rules, anti-spoofing), or let all of"
            " it pass.",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="A new name for the port.")] = None,
    json: Json = False,
) -> None:
    """Change a port (PORT_ID, or --vm for a VM's first NIC): its security groups, port
    security or name. Only what is given changes."""
    if (port_id is None) == (vm is None):
        raise CliError("give exactly one of PORT_ID and --vm")
    changes = _changes(security_group, no_security_groups, port_security, name)
    with connect(ctx) as kumo:
        project = current_project(kumo)
        updated = kumo.ports.update(target_port(kumo, port_id, vm), project=project, **changes)
    if json:
        return output.emit_json(updated.raw)
    output.note(_summary(updated))
    return None
