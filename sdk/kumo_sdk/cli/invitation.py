"""`kumo invitation`: invite people to the project by e-mail (the one way in; `kumo member
invite` does the same), list and revoke invitations; accept one."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("Invitations to the project (admins), and accepting one.")
RoleOption = Annotated[str, typer.Option(help="reader, member, admin or owner")]


@command(app, "list")
def invitation_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's invitations and their status."""
    with connect(ctx) as kumo:
        items = list(kumo.invitations.list(project=current_project(kumo)))
    show(
        items,
        json,
        ["ID", "EMAIL", "ROLE", "STATUS", "INVITED BY", "EXPIRES"],
        lambda i: [i.id, i.email, i.role, i.status, i.invited_by, i.expires_at],
    )


def invite(ctx: typer.Context, email: str, role: str, json: bool) -> None:
    """Invite ``email`` to the current project and say so (``kumo invitation create`` and
    ``kumo member invite``): the same answer whether or not the address has an account."""
    with connect(ctx) as kumo:
        item = kumo.invitations.create(email, role=role, project=current_project(kumo))
    if json:
        return output.emit_json(item.raw)
    output.note(f"Invitation {item.id} sent to {item.email} as {item.role}.")
    return None


@command(app, "create")
def invitation_create(
    ctx: typer.Context, email: str, role: RoleOption = "member", json: Json = False
) -> None:
    """Invite EMAIL; they accept after logging in (the same answer for every address)."""
    invite(ctx, email, role, json)


@command(app, "revoke")
def invitation_revoke(ctx: typer.Context, invitation_id: int) -> None:
    """Revoke a pending invitation."""
    with connect(ctx) as kumo:
        kumo.invitations.delete(invitation_id, project=current_project(kumo))
    output.note(f"Invitation {invitation_id} revoked.")


@command(app, "accept")
def invitation_accept(ctx: typer.Context, token: str) -> None:
    """Accept an invitation with the token from its e-mail's link."""
    with connect(ctx) as kumo:
        done = kumo.invitations.accept(token)
    output.note(f"You joined {done['project']} as {done['role']}.")
