"""`kumo bucket`: the project's S3 buckets."""

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

app = group("The project's S3 buckets.")


@command(app, "list")
def bucket_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's buckets, their quotas and last measured usage."""
    with connect(ctx) as kumo:
        buckets = list(kumo.buckets.list(project=current_project(kumo)))
    if json:
        return output.emit_json([b.raw for b in buckets])
    output.table(
        ["NAME", "QUOTA GIB", "USED BYTES", "MEASURED", "ENDPOINT"],
        [[b.name, b.quota_gib, b.used_bytes, b.usage_at, b.endpoint] for b in buckets],
    )


@command(app, "create")
def bucket_create(
    ctx: typer.Context,
    name: str,
    quota: Annotated[int, typer.Option("--quota", help="Quota in GiB.")],
    json: Json = False,
) -> None:
    """Create a bucket (its name is global across the object store)."""
    with connect(ctx) as kumo:
        bucket = kumo.buckets.create(name, quota_gib=quota, project=current_project(kumo))
    if json:
        return output.emit_json(bucket.raw)
    output.note(f"Bucket {bucket.name} created ({bucket.quota_gib} GiB) at {bucket.endpoint}.")


@command(app, "delete")
def bucket_delete(ctx: typer.Context, name: str) -> None:
    """Delete a bucket and everything in it."""
    with connect(ctx) as kumo:
        kumo.buckets.delete(name, project=current_project(kumo))
    output.note(f"Bucket {name} deleted.")
