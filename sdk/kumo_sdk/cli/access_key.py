"""`kumo access-key`: the project's S3 access keys."""

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

app = group("The project's S3 access keys.")


@command(app, "list")
def key_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's access keys (their secrets are never shown again)."""
    with connect(ctx) as kumo:
        keys = list(kumo.access_keys.list(project=current_project(kumo)))
    if json:
        return output.emit_json([k.raw for k in keys])
    output.table(
        ["ID", "ACCESS KEY ID", "CREATED BY", "CREATED", "DESCRIPTION"],
        [[k.id, k.access_key_id, k.created_by, k.created_at, k.description] for k in keys],
    )


@command(app, "create")
def key_create(ctx: typer.Context, description: str = "", json: Json = False) -> None:
    """Make an access key (project admins); its secret is shown this once."""
    with connect(ctx) as kumo:
        key = kumo.access_keys.create(project=current_project(kumo), description=description)
    if json:
        return output.emit_json(key.raw)
    output.note(f"Access key {key.access_key_id} (id {key.id}) for {key.endpoint}.")
    output.note("The secret is shown only now:")
    output.out.print(key.secret_access_key, markup=False)


@command(app, "delete")
def key_delete(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help="The key's id or access key id.")],
) -> None:
    """Revoke an access key: it stops working at once."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        key_id = int(key) if key.isdigit() else kumo.access_keys.find(key, project=project).id
        kumo.access_keys.delete(key_id, project=project)
    output.note(f"Access key {key} deleted.")
