"""Prepaid points: a ledger per project of credits, adjustments and invoice debits, each
entry with the balance after it, which never goes below zero."""

from decimal import Decimal

from django.db import transaction

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from tenants.billing.rounding import PRICE_QUANTUM, _quantize
from tenants.choices import PointsKind
from tenants.models import Invoice, PointsEntry, Project


def points_balance(project: Project) -> Decimal:
    """The project's points balance: the last ledger entry's ``balance_after``."""
    last = PointsEntry.objects.for_project(project).order_by("-id").first()
    return last.balance_after if last else Decimal(0)


def _append_points(project: Project, *, kind: str, amount: Decimal, **fields) -> PointsEntry:
    Project.objects.select_for_update().filter(pk=project.pk).first()  # one writer a project
    balance = points_balance(project) + amount
    if balance < 0:
        raise Conflict(
            f"the points balance of {project.slug} would go below zero",
            code="insufficient_points",
            details={"amount": [f"balance {balance - amount}"]},
        )
    return PointsEntry.objects.create(
        project=project, kind=kind, amount=amount, balance_after=balance, **fields
    )


@transaction.atomic
def points_credit(
    *,
    project: Project,
    amount: Decimal,
    note: str = "",
    kind: str = PointsKind.CREDIT,
    actor=None,
) -> PointsEntry:
    """Add points to a project (operators: a purchase or a grant), or with
    ``kind=adjustment`` a signed correction; the balance never goes below zero (409)."""
    amount = Decimal(amount)
    if kind not in (PointsKind.CREDIT, PointsKind.ADJUSTMENT):
        raise InvalidInput.field("kind", "must be credit or adjustment")
    if not amount.is_finite() or amount == 0 or (kind == PointsKind.CREDIT and amount < 0):
        raise InvalidInput.field("amount", "must be more than 0 (an adjustment: not 0)")
    if abs(amount) >= Decimal(10) ** 13:
        raise InvalidInput.field("amount", "is too large")
    entry = _append_points(
        project,
        kind=kind,
        amount=_quantize(amount, PRICE_QUANTUM),
        note=note[:200],
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    audit.record(
        f"points.{kind}",
        entry,
        project=project,
        detail={"amount": str(entry.amount), "balance": str(entry.balance_after)},
    )
    return entry


def _draw_points(invoice: Invoice, *, actor=None) -> None:
    """Pay ``invoice`` from the project's points as far as they go (once per invoice)."""
    project = invoice.project
    Project.objects.select_for_update().filter(pk=project.pk).first()
    available = points_balance(project)
    drawn = min(available, invoice.total)
    if drawn <= 0:
        return
    _append_points(
        project,
        kind=PointsKind.DEBIT,
        amount=-drawn,
        invoice=invoice,
        note=f"invoice {invoice.period_start:%Y-%m}",
        created_by=actor,
    )
    invoice.points_applied, invoice.amount_due = drawn, invoice.total - drawn
    invoice.save(update_fields=["points_applied", "amount_due"])
