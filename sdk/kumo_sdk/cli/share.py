"""`kumo share`: the project's shared file systems."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("The project's shared file systems (mounted by its VMs).")
ShareArg = Annotated[str, typer.Argument(help="The share's name or id.")]


@command(app, "list")
def share_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's shares, their quotas and usage."""
    with connect(ctx) as kumo:
        shares = list(kumo.shares.list(project=current_project(kumo)))
    show(
        shares,
        json,
        ["NAME", "ID", "TIER", "QUOTA GIB", "USED BYTES", "READY", "MOUNT"],
        lambda s: [s.name, s.id, s.tier, s.quota_gib, s.used_bytes, s.ready, s.mount_command],
    )


@command(app, "create")
def share_create(
    ctx: typer.Context,
    name: str,
    quota: Annotated[int, typer.Option("--quota", help="Quota in GiB.")],
    tier: Annotated[str, typer.Option(help="fast or large.")] = "fast",
    json: Json = False,
) -> None:
    """Create a share (its quota counts against the storage quota)."""
    with connect(ctx) as kumo:
        share = kumo.shares.create(name, tier=tier, quota_gib=quota, project=current_project(kumo))
    if json:
        return output.emit_json(share.raw)
    output.note(f"Share {share.name} created: {share.quota_gib} GiB {share.tier} (id {share.id}).")
    return None


@command(app, "extend")
def share_extend(
    ctx: typer.Context,
    share: ShareArg,
    quota: Annotated[int, typer.Option("--quota", help="The new quota in GiB.")],
) -> None:
    """Grow a share's quota."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = kumo.shares.find(share, project=project)
        extended = kumo.shares.extend(found.id, quota, project=project)
    output.note(f"Share {extended.name} is now {extended.quota_gib} GiB.")


@command(app, "delete")
def share_delete(ctx: typer.Context, share: ShareArg) -> None:
    """Delete a share and its files."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = kumo.shares.find(share, project=project)
        kumo.shares.delete(found.id, project=project)
    output.note(f"Share {found.name} deleted.")
