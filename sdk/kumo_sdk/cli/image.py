"""`kumo image`: images the project may boot, and its own uploads."""

from pathlib import Path
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
from kumo_sdk.types import Image

app = group("Images the project may boot, and its own uploads.")

ImageArg = Annotated[str, typer.Argument(help="The image's name or id.")]


def _details(image: Image) -> None:
    output.fields(
        [
            ("name", image.name),
            ("id", image.id),
            ("state", image.state),
            ("reason", image.state_reason),
            ("os", f"{image.os_distro} {image.os_version}".strip()),
            ("format", image.format),
            ("login user", image.login_user),
            ("size", f"{image.size_bytes} bytes" if image.size_bytes else ""),
            ("checksum", image.checksum),
            ("min disk", f"{image.min_disk_gib} GiB"),
            ("min memory", f"{image.min_memory_gib} GiB"),
            ("visibility", image.visibility),
            ("project", image.project),
            ("created", image.created_at),
        ]
    )


@command(app, "list")
def image_list(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="uploading, active or failed.")] = None,
    json: Json = False,
) -> None:
    """Images the project may boot (public ones) and its own, with their state."""
    with connect(ctx) as kumo:
        filters = {"state": state} if state else {}
        images = list(kumo.images.list(project=current_project(kumo), **filters))
    if json:
        return output.emit_json([i.raw for i in images])
    output.table(
        ["ID", "NAME", "STATE", "DISTRO", "VERSION", "FORMAT", "SIZE", "LOGIN", "VISIBILITY"],
        [
            [
                i.id, i.name, i.state, i.os_distro, i.os_version, i.format, i.size_bytes,
                i.login_user, i.visibility,
            ]
            for i in images
        ],
    )  # fmt: skip


@command(app, "show")
def image_show(ctx: typer.Context, image: ImageArg, json: Json = False) -> None:
    """One image: its state (and why it failed), checksum, size and login user."""
    with connect(ctx) as kumo:
        found = kumo.images.find(image, project=current_project(kumo))
    if json:
        return output.emit_json(found.raw)
    _details(found)


@command(app, "upload")
def image_upload(
    ctx: typer.Context,
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="The disk image file (qcow2 or raw).")
    ],
    name: Annotated[str, typer.Option(help="The image's name.")],
    os_distro: Annotated[str, typer.Option(help="e.g. debian.")],
    disk_format: Annotated[str, typer.Option("--format", help="qcow2 or raw.")] = "qcow2",
    os_version: Annotated[str, typer.Option(help="e.g. 12.")] = "",
    login_user: Annotated[
        str, typer.Option(help="The user a guest of this image is logged into, e.g. debian.")
    ] = "",
    min_disk_gib: Annotated[int, typer.Option(help="The smallest root disk it needs.")] = 0,
    min_memory_gib: Annotated[int, typer.Option(help="The least memory it needs.")] = 0,
    checksum: Annotated[
        str, typer.Option(help="sha256:<hex> the upload must match (else it fails).")
    ] = "",
    description: str = "",
    json: Json = False,
) -> None:
    """Upload one of the project's own images: streamed from the file, checked by SHA-256."""
    must_be_file(path, "PATH")
    with connect(ctx) as kumo:
        project = current_project(kumo)
        created = kumo.images.create(
            name,
            project=project,
            os_distro=os_distro,
            os_version=os_version,
            format=disk_format,
            login_user=login_user,
            min_disk_gib=min_disk_gib,
            min_memory_gib=min_memory_gib,
            checksum=checksum or None,
            description=description,
        )
        image = kumo.images.upload(created.id, path, project=project)
    uploaded(image, json)


def must_be_file(path: Path, hint: str) -> None:
    """A file to upload, checked before anything is asked of the API."""
    if not path.is_file():
        raise typer.BadParameter(f"{path} is not a file", param_hint=hint)


def uploaded(image: Image, json: bool) -> None:
    """What an upload made: the image with its size and checksum, or its JSON."""
    if json:
        output.emit_json(image.raw)
    else:
        output.note(
            f"Image {image.name} is {image.state}: {image.size_bytes} bytes, {image.checksum} "
            f"(id {image.id})."
        )


@command(app, "delete")
def image_delete(ctx: typer.Context, image: ImageArg) -> None:
    """Delete one of the project's own images (refused while a VM uses it)."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        found = kumo.images.find(image, project=project)
        kumo.images.delete(found.id, project=project)
    output.note(f"Image {found.name} deleted.")
