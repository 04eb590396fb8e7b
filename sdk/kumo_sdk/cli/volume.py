"""`kumo volume`: the project's block volumes."""

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
from kumo_sdk.types import Volume

app = group("The project's block volumes.")


VolumeArg = Annotated[str, typer.Argument(help="The volume's name or id.")]


def _volume_details(volume: Volume) -> None:
    output.fields(
        [
            ("name", volume.name),
            ("id", volume.id),
            ("state", volume.state),
            ("size", f"{volume.size_gib} GiB"),
            ("tier", volume.tier),
            ("vm", volume.vm),
            ("device", volume.device),
            ("guest path", volume.guest_path),
            ("host", volume.host),
            ("description", volume.description),
            ("created", volume.created_at),
        ]
    )


@command(app, "list")
def volume_list(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="available or in_use.")] = None,
    json: Json = False,
) -> None:
    """The project's volumes and what they are attached to."""
    with connect(ctx) as kumo:
        filters = {"state": state} if state else {}
        volumes = list(kumo.volumes.list(project=current_project(kumo), **filters))
    if json:
        return output.emit_json([v.raw for v in volumes])
    output.table(
        ["NAME", "ID", "SIZE GIB", "TIER", "STATE", "VM", "DEVICE"],
        [[v.name, v.id, v.size_gib, v.tier, v.state, v.vm, v.device] for v in volumes],
    )


@command(app, "create")
def volume_create(
    ctx: typer.Context,
    name: str,
    size: Annotated[int, typer.Option("--size", help="Size in GiB.")],
    tier: Annotated[
        str | None, typer.Option(help="shared (any host; the default) or local (one host's NVMe).")
    ] = None,
    description: str = "",
    json: Json = False,
) -> None:
    """Create a volume (it counts against the storage quota at once)."""
    with connect(ctx) as kumo:
        volume = kumo.volumes.create(
            name, size_gib=size, project=current_project(kumo), tier=tier, description=description
        )
    if json:
        return output.emit_json(volume.raw)
    output.note(
        f"Volume {volume.name} created: {volume.size_gib} GiB {volume.tier} (id {volume.id})."
    )


@command(app, "attach")
def volume_attach(
    ctx: typer.Context,
    volume: VolumeArg,
    vm: Annotated[str, typer.Argument(help="The VM's name or id.")],
    json: Json = False,
) -> None:
    """Attach a volume to a VM as its next free disk (a running guest sees it after a reboot)."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = kumo.volumes.find(volume, project=project)
        target = kumo.vms.find(vm, project=project)
        attached = kumo.volumes.attach(found.id, target.id)
    if json:
        return output.emit_json(attached.raw)
    output.note(
        f"Volume {attached.name} attached to VM {target.name} as {attached.device}"
        f" ({attached.guest_path})."
    )


@command(app, "detach")
def volume_detach(ctx: typer.Context, volume: VolumeArg, json: Json = False) -> None:
    """Detach a volume from its VM; its data stays."""
    with connect(ctx) as kumo:
        found = kumo.volumes.find(volume, project=current_project(kumo))
        detached = kumo.volumes.detach(found.id)
    if json:
        return output.emit_json(detached.raw)
    output.note(f"Volume {detached.name} detached.")


@command(app, "extend")
def volume_extend(
    ctx: typer.Context,
    volume: VolumeArg,
    size: Annotated[int, typer.Option("--size", help="The new size in GiB.")],
    json: Json = False,
) -> None:
    """Grow a volume to --size GiB."""
    with connect(ctx) as kumo:
        found = kumo.volumes.find(volume, project=current_project(kumo))
        extended = kumo.volumes.extend(found.id, size)
    if json:
        return output.emit_json(extended.raw)
    output.note(f"Volume {extended.name} is now {extended.size_gib} GiB.")


@command(app, "delete")
def volume_delete(ctx: typer.Context, volume: VolumeArg) -> None:
    """Delete a detached volume and its data."""
    with connect(ctx) as kumo:
        found = kumo.volumes.find(volume, project=current_project(kumo))
        kumo.volumes.delete(found.id)
    output.note(f"Volume {found.name} deleted.")
