"""`kumo user`: users for operators (list, create, deactivate, reactivate, identities)."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, group, show

app = group("Users, for operators.")


@command(app, "list")
def user_list(
    ctx: typer.Context,
    q: Annotated[
        str | None, typer.Option(help="Search username, e-mail, name, organisation.")
    ] = None,
    json: Json = False,
) -> None:
    """Every user."""
    with connect(ctx) as kumo:
        users = list(kumo.admin.users.list(q=q))
    show(
        users,
        json,
        ["USERNAME", "EMAIL", "NAME", "ORGANISATION", "ACTIVE", "STAFF", "IDENTITIES"],
        lambda u: [u.username, u.email, u.display_name, u.organisation, u.is_active,
                   u.is_staff, len(u.identities)],
    )  # fmt: skip


@command(app, "show")
def user_show(ctx: typer.Context, username: str, json: Json = False) -> None:
    """A user and their federated identities."""
    with connect(ctx) as kumo:
        u = kumo.admin.users.get(username)
    if json:
        return output.emit_json(u.raw)
    output.note(f"{u.username} ({u.display_name or '-'}, {u.email or '-'}), active={u.is_active}")
    output.table(
        ["KIND", "ISSUER", "SUBJECT", "LAST LOGIN"],
        [[i.kind, i.issuer, i.subject, i.last_login_at] for i in u.identities],
    )
    return None


@command(app, "create")
def user_create(
    ctx: typer.Context,
    username: str,
    email: Annotated[str, typer.Option()] = "",
    staff: Annotated[bool, typer.Option("--staff", help="An operator.")] = False,
) -> None:
    """Create a user without a password (they log in through their institution, or an
    operator sets a password in the admin console)."""
    with connect(ctx) as kumo:
        u = kumo.admin.users.create(username, email=email, is_staff=staff)
    output.note(f"User {u.username} created.")


@command(app, "deactivate")
def user_deactivate(
    ctx: typer.Context, username: str, reason: Annotated[str, typer.Option()] = ""
) -> None:
    """Lock a user out: sessions end and API tokens are revoked at once."""
    with connect(ctx) as kumo:
        kumo.admin.users.deactivate(username, reason)
    output.note(f"User {username} deactivated; sessions ended, tokens revoked.")


@command(app, "reactivate")
def user_reactivate(ctx: typer.Context, username: str) -> None:
    """Let a deactivated user in again (old tokens stay revoked)."""
    with connect(ctx) as kumo:
        kumo.admin.users.reactivate(username)
    output.note(f"User {username} reactivated.")
