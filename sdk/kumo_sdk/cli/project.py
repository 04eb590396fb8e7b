"""`kumo project`: your projects, which one commands act on, and deleting one."""

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

app = group("Your projects, and which one commands act on.")


@command(app, "list")
def project_list(ctx: typer.Context, json: Json = False) -> None:
    """Projects you hold a role in; * marks the one commands act on."""
    with connect(ctx) as kumo:
        projects = list(kumo.projects.list())
        current = kumo.project
    if json:
        return output.emit_json([p.raw for p in projects])
    output.table(
        ["", "SLUG", "NAME", "ROLE", "STATUS", "VALID UNTIL"],
        [
            ["*" if p.slug == current else "", p.slug, p.name, p.my_role, p.status, p.valid_until]
            for p in projects
        ],
    )


@command(app, "use")
def project_use(ctx: typer.Context, slug: str) -> None:
    """Act on project SLUG from now on."""
    with connect(ctx) as kumo:
        project = kumo.projects.get(slug)
    config = Config.load()
    config.project = project.slug
    config.save()
    output.note(f"Now using project {project.slug} ({project.name}) as {project.my_role}.")


@command(app, "delete")
def project_delete(
    ctx: typer.Context,
    slug: Annotated[
        str, typer.Argument(help="The project's slug, in full: never the current one unnamed.")
    ],
) -> None:
    """Delete project SLUG (its owner). Only a project that holds nothing and was never
    billed goes; one that ran anything ends with its validity instead, its bills kept."""
    with connect(ctx) as kumo:
        kumo.projects.delete(slug)
    config = Config.load()
    if config.project == slug:
        config.project = None
        config.save()
        output.note(f"Project {slug} deleted. No project is chosen now: kumo project use SLUG.")
    else:
        output.note(f"Project {slug} deleted.")
