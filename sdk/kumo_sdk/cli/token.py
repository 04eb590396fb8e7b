"""`kumo token`: your API tokens."""

from datetime import datetime
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    Json,
    command,
    connect,
    group,
)
from kumo_sdk.cli.config import Config

app = group("Your API tokens.")


@command(app, "list")
def token_list(ctx: typer.Context, json: Json = False) -> None:
    """Your tokens; * marks the one this CLI uses."""
    with connect(ctx) as kumo:
        tokens = list(kumo.tokens.list())
    if json:
        return output.emit_json([t.raw for t in tokens])
    current = Config.load().token_id
    output.table(
        ["", "ID", "NAME", "PREFIX", "PROJECT", "EXPIRES", "LAST USED", "REVOKED"],
        [
            [
                "*" if t.id == current else "",
                t.id,
                t.name,
                t.prefix,
                t.project,
                t.expires_at,
                t.last_used_at,
                t.revoked_at,
            ]
            for t in tokens
        ],
    )


@command(app, "create")
def token_create(
    ctx: typer.Context,
    name: str,
    project: Annotated[
        str | None, typer.Option("--scope", help="Scope the token to this project only.")
    ] = None,
    expires_at: Annotated[
        datetime | None, typer.Option(help="When it stops working (ISO 8601).")
    ] = None,
    json: Json = False,
) -> None:
    """Make a token (for a script or another machine); its secret is shown this once."""
    with connect(ctx) as kumo:
        token = kumo.tokens.create(name, project=project, expires_at=expires_at)
    if json:
        return output.emit_json(token.raw)
    output.note(f"Token {token.name} (id {token.id}); the secret is shown only now:")
    output.out.print(token.token, markup=False)


@command(app, "revoke")
def token_revoke(ctx: typer.Context, token_id: int) -> None:
    """Revoke a token: it stops working at once and stays listed as revoked."""
    with connect(ctx) as kumo:
        kumo.tokens.revoke(token_id)
    output.note(f"Token {token_id} revoked.")
