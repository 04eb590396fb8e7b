"""`kumo application`: apply for a project, a renewal or more quota; operators review."""

from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, group, show

app = group("Project applications: apply, amend, withdraw; operators review.")

Opt = typer.Option


@command(app, "list")
def application_list(ctx: typer.Context, json: Json = False) -> None:
    """Your applications (operators: everyone's)."""
    with connect(ctx) as kumo:
        items = list(kumo.applications.list())
    show(
        items,
        json,
        ["ID", "KIND", "STATE", "APPLICANT", "SLUG", "TITLE", "GPUS", "UNTIL"],
        lambda a: [a.id, a.kind, a.state, a.applicant, a.slug, a.title, a.gpus, a.valid_until],
    )


@command(app, "apply")
def application_apply(
    ctx: typer.Context,
    title: str,
    purpose: Annotated[str, Opt(help="What the project will do.")],
    kind: Annotated[str, Opt(help="new, renewal or quota")] = "new",
    slug: Annotated[str | None, Opt(help="The new project's slug (kind new).")] = None,
    project: Annotated[str | None, Opt(help="The project (renewal, quota).")] = None,
    field: Annotated[str | None, Opt(help="Research field.")] = None,
    vcpus: Annotated[int | None, Opt()] = None,
    memory_gib: Annotated[int | None, Opt()] = None,
    gpus: Annotated[int | None, Opt()] = None,
    storage_gib: Annotated[int | None, Opt()] = None,
    global_ips: Annotated[int | None, Opt()] = None,
    valid_from: Annotated[str | None, Opt(help="YYYY-MM-DD")] = None,
    valid_until: Annotated[str | None, Opt(help="YYYY-MM-DD")] = None,
    json: Json = False,
) -> None:
    """Apply for a new project (or a renewal, or a quota increase)."""
    with connect(ctx) as kumo:
        item = kumo.applications.create(
            kind=kind, title=title, purpose=purpose, slug=slug, project=project, field=field,
            vcpus=vcpus, memory_gib=memory_gib, gpus=gpus, storage_gib=storage_gib,
            global_ips=global_ips, valid_from=valid_from, valid_until=valid_until,
        )  # fmt: skip
    if json:
        return output.emit_json(item.raw)
    output.note(f"Application {item.id} submitted ({item.kind}: {item.title}).")
    return None


@command(app, "show")
def application_show(ctx: typer.Context, application_id: int, json: Json = False) -> None:
    """One application, with the reviewer's comment."""
    with connect(ctx) as kumo:
        a = kumo.applications.get(application_id)
    if json:
        return output.emit_json(a.raw)
    show([a], False, ["ID", "STATE", "TITLE", "COMMENT"], lambda a: [a.id, a.state, a.title,
         a.review_comment])  # fmt: skip
    return None


@command(app, "amend")
def application_amend(
    ctx: typer.Context,
    application_id: int,
    purpose: Annotated[str | None, Opt()] = None,
    gpus: Annotated[int | None, Opt()] = None,
    vcpus: Annotated[int | None, Opt()] = None,
    memory_gib: Annotated[int | None, Opt()] = None,
    storage_gib: Annotated[int | None, Opt()] = None,
    valid_until: Annotated[str | None, Opt(help="YYYY-MM-DD")] = None,
) -> None:
    """Change a returned application; it is submitted again."""
    changes = {
        k: v
        for k, v in dict(
            purpose=purpose, gpus=gpus, vcpus=vcpus, memory_gib=memory_gib,
            storage_gib=storage_gib, valid_until=valid_until,
        ).items()
        if v is not None
    }  # fmt: skip
    with connect(ctx) as kumo:
        a = kumo.applications.update(application_id, **changes)
    output.note(f"Application {a.id} is {a.state}.")


@command(app, "review")
def application_review(
    ctx: typer.Context,
    application_id: int,
    decision: Annotated[str, typer.Argument(help="approve, return or reject")],
    comment: Annotated[str, Opt(help="Required to return.")] = "",
) -> None:
    """Decide on an application (operators)."""
    with connect(ctx) as kumo:
        a = kumo.applications.review(application_id, decision, comment)
    where = f" (project {a.project})" if a.project else ""
    output.note(f"Application {a.id} is {a.state}{where}.")


@command(app, "withdraw")
def application_withdraw(ctx: typer.Context, application_id: int) -> None:
    """Withdraw your pending application."""
    with connect(ctx) as kumo:
        a = kumo.applications.withdraw(application_id)
    output.note(f"Application {a.id} is {a.state}.")
