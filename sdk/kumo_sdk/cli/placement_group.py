"""`kumo placement-group`: the project's placement groups."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("Placement groups: affinity, anti-affinity or compact (one rack).")


@command(app, "list")
def placement_group_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's placement groups."""
    with connect(ctx) as kumo:
        groups = list(kumo.placement_groups.list(project=current_project(kumo)))
    show(groups, json, ["ID", "NAME", "POLICY"], lambda g: [g.id, g.name, g.policy])


@command(app, "create")
def placement_group_create(
    ctx: typer.Context,
    name: str,
    policy: Annotated[str, typer.Option(help="affinity, anti_affinity or compact.")],
    json: Json = False,
) -> None:
    """Create a placement group."""
    with connect(ctx) as kumo:
        made = kumo.placement_groups.create(name, policy=policy, project=current_project(kumo))
    if json:
        return output.emit_json(made.raw)
    output.note(f"Placement group {made.name} ({made.policy}) created (id {made.id}).")
    return None


@command(app, "delete")
def placement_group_delete(ctx: typer.Context, name: str) -> None:
    """Delete an empty placement group."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = kumo.placement_groups.find(name, project=project)
        kumo.placement_groups.delete(found.id, project=project)
    output.note(f"Placement group {found.name} deleted.")
