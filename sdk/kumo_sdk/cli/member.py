"""`kumo member`: the project's members and their roles. People join by invitation only
(`kumo member invite EMAIL`): naming a username would tell an admin who has an account."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show
from kumo_sdk.cli.invitation import invite

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


@command(app, "invite")
def member_invite(
    ctx: typer.Context,
    email: Annotated[str, typer.Argument(help="Their e-mail address.")],
    role: Role = "member",
    json: Json = False,
) -> None:
    """Invite EMAIL to the project (admins; only owners invite owners). They become a
    member when they accept, after logging in; the answer is the same whether or not the
    address has an account. `kumo invitation list` and `revoke ID` follow it up."""
    invite(ctx, email, role, json)


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
