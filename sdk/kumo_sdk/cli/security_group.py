"""`kumo security-group`: security groups (firewall allow-lists) and their rules."""

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
from kumo_sdk.types import SecurityGroupRule

app = group("Security groups (firewall allow-lists) and their rules.")


def _rule_text(rule: SecurityGroupRule) -> str:
    ports = ""
    if rule.port_min is not None:
        ports = f" {rule.port_min}" + (
            f"-{rule.port_max}" if rule.port_max not in (None, rule.port_min) else ""
        )
    peer = rule.remote_cidr or (f"group {rule.remote_group}" if rule.remote_group else "any")
    side = "from" if rule.direction == "ingress" else "to"
    return f"#{rule.id} {rule.direction} {rule.protocol}{ports} {side} {peer}"


@command(app, "list")
def sg_list(ctx: typer.Context, json: Json = False) -> None:
    """Security groups with their rules."""
    with connect(ctx) as kumo:
        groups = list(kumo.security_groups.list(project=current_project(kumo)))
    if json:
        return output.emit_json([g.raw for g in groups])
    output.table(
        ["ID", "NAME", "RULES", "DESCRIPTION"],
        [[g.id, g.name, "\n".join(map(_rule_text, g.rules)), g.description] for g in groups],
    )


@command(app, "create")
def sg_create(ctx: typer.Context, name: str, description: str = "", json: Json = False) -> None:
    """Create a security group (no rules: it allows nothing until you add some)."""
    with connect(ctx) as kumo:
        group = kumo.security_groups.create(
            name, project=current_project(kumo), description=description
        )
    if json:
        return output.emit_json(group.raw)
    output.note(f"Security group {group.name} created (id {group.id}).")


@command(app, "rule-add")
def sg_rule_add(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="The security group's name.")],
    direction: Annotated[str, typer.Option(help="ingress or egress.")] = "ingress",
    protocol: Annotated[str, typer.Option(help="any, tcp, udp or icmp.")] = "any",
    port: Annotated[str | None, typer.Option(help="A port or a range: 22 or 8000-8100.")] = None,
    remote_cidr: Annotated[str, typer.Option(help="Peers in this CIDR.")] = "",
    remote_group: Annotated[str | None, typer.Option(help="Peers in this group.")] = None,
    description: str = "",
    json: Json = False,
) -> None:
    """Allow a flow: add a rule to a security group."""
    port_min = port_max = None
    if port:
        low, _, high = port.partition("-")
        if not (low.isdigit() and (not high or high.isdigit())):
            raise typer.BadParameter(f"{port!r} is not a port or a range", param_hint="--port")
        port_min, port_max = int(low), int(high or low)
    with connect(ctx) as kumo:
        rule = kumo.security_groups.add_rule(
            group,
            project=current_project(kumo),
            direction=direction,
            protocol=protocol,
            port_min=port_min,
            port_max=port_max,
            remote_cidr=remote_cidr,
            remote_group=remote_group,
            description=description,
        )
    if json:
        return output.emit_json(rule.raw)
    output.note(f"Rule added to {rule.group}: {_rule_text(rule)}.")


@command(app, "rule-delete")
def sg_rule_delete(ctx: typer.Context, rule_id: int) -> None:
    """Delete a rule by id (kumo security-group list shows them as #ID)."""
    with connect(ctx) as kumo:
        kumo.security_groups.delete_rule(rule_id, project=current_project(kumo))
    output.note(f"Rule {rule_id} deleted.")
