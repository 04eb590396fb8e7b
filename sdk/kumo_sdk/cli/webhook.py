"""`kumo webhook`: the project's webhooks."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("The project's webhooks (events POSTed to a URL, signed).")


@command(app, "list")
def webhook_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's webhooks and their last delivery."""
    with connect(ctx) as kumo:
        hooks = list(kumo.webhooks.list(project=current_project(kumo)))
    show(
        hooks,
        json,
        ["ID", "URL", "KINDS", "ACTIVE", "LAST DELIVERY", "LAST STATUS"],
        lambda h: [h.id, h.url, h.kinds or "all", h.active, h.last_delivery_at, h.last_status],
    )


@command(app, "create")
def webhook_create(
    ctx: typer.Context,
    url: str,
    kind: Annotated[
        list[str] | None, typer.Option(help="Only events of this kind; repeatable (all if none).")
    ] = None,
    json: Json = False,
) -> None:
    """Add a webhook; its signing secret is shown this once."""
    with connect(ctx) as kumo:
        hook = kumo.webhooks.create(url, kinds=kind, project=current_project(kumo))
    if json:
        return output.emit_json(hook.raw)
    output.note(f"Webhook {hook.id} to {hook.url}; the signing secret is shown only now:")
    output.out.print(hook.secret, markup=False)
    return None


@command(app, "delete")
def webhook_delete(ctx: typer.Context, webhook_id: int) -> None:
    """Delete a webhook by id."""
    with connect(ctx) as kumo:
        kumo.webhooks.delete(webhook_id, project=current_project(kumo))
    output.note(f"Webhook {webhook_id} deleted.")
