"""`kumo member`: the project's members and their roles."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("The project's members and their roles (reader < member < admin < owner).")
Role = Annotated[str, typer.Option(help="reader, member, admin or owner.")]


@command(app, "list")
def member_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's members."""
    with connect(ctx) as kumo:
        members = list(kumo.members.list(project=current_project(kumo)))
    show(
        members,
        json,
        ["USERNAME", "EMAIL", "ROLE", "SINCE"],
        lambda m: [m.user.username, m.user.email, m.role, m.created_at],
    )


@command(app, "add")
def member_add(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(help="Username or email.")],
    role: Role = "member",
    json: Json = False,
) -> None:
    """Add a member (project admins; only owners grant owner)."""
    with connect(ctx) as kumo:
        member = kumo.members.create(user, role=role, project=current_project(kumo))
    if json:
        return output.emit_json(member.raw)
    output.note(f"{member.user.username} is now {member.role} of project {kumo.project}.")
    return None


@command(app, "set-role")
def member_set_role(
    ctx: typer.Context, username: str, role: Annotated[str, typer.Argument(help="The new role.")]
) -> None:
    """Change a member's role."""
    with connect(ctx) as kumo:
        member = kumo.members.update(username, role=role, project=current_project(kumo))
    output.note(f"{member.user.username} is now {member.role}.")


@command(app, "remove")
def member_remove(ctx: typer.Context, username: str) -> None:
    """Take a member out of the project (the owner stays)."""
    with connect(ctx) as kumo:
        kumo.members.delete(username, project=current_project(kumo))
    output.note(f"{username} removed.")
