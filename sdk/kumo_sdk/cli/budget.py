"""`kumo budget` and `kumo points`: the project's budgets and its prepaid points."""

from decimal import Decimal
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, current_project, group, show

app = group("The project's monthly budgets and their alerts.")


@command(app, "list")
def budget_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's budgets."""
    with connect(ctx) as kumo:
        budgets = list(kumo.budgets.list(project=current_project(kumo)))
    show(
        budgets,
        json,
        ["ID", "NAME", "AMOUNT", "THRESHOLDS %", "POLICY", "ACTIVE"],
        lambda b: [b.id, b.name, b.amount, b.thresholds, b.policy, b.active],
    )


@command(app, "create")
def budget_create(
    ctx: typer.Context,
    name: str,
    amount: Annotated[
        Decimal, typer.Option(help="The monthly amount, in the rate card's currency.")
    ],
    threshold: Annotated[
        list[int] | None, typer.Option(help="Alert at this percent; repeatable (50 80 100).")
    ] = None,
    policy: Annotated[str, typer.Option(help="notify, stop_spot or stop_all at 100 %.")] = "notify",
    json: Json = False,
) -> None:
    """Create a budget (project admins)."""
    with connect(ctx) as kumo:
        budget = kumo.budgets.create(
            name,
            amount=str(amount),
            thresholds=threshold,
            policy=policy,
            project=current_project(kumo),
        )
    if json:
        return output.emit_json(budget.raw)
    output.note(f"Budget {budget.name} (id {budget.id}): {budget.amount} a month, {budget.policy}.")
    return None


@command(app, "delete")
def budget_delete(ctx: typer.Context, budget_id: int) -> None:
    """Delete a budget by id."""
    with connect(ctx) as kumo:
        kumo.budgets.delete(budget_id, project=current_project(kumo))
    output.note(f"Budget {budget_id} deleted.")


def points(ctx: typer.Context, json: Json = False) -> None:
    """The project's prepaid points ledger, newest balance last."""
    with connect(ctx) as kumo:
        entries = list(kumo.points.list(project=current_project(kumo)))
    show(
        entries,
        json,
        ["ID", "KIND", "AMOUNT", "BALANCE AFTER", "INVOICE", "NOTE", "AT"],
        lambda p: [p.id, p.kind, p.amount, p.balance_after, p.invoice, p.note, p.created_at],
    )
