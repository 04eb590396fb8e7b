"""Invoices: rating a month into a document, issuing it, and checking it again.

The invoice document is canonical JSON (sorted keys, no spaces, ASCII, every number a
string with fixed places, lines in a fixed order, no timestamp of its making); the CSV is
derived from it. The same intervals and rate cards give the same bytes, and the invoice
stores the SHA-256 of the JSON, so ``invoice_verify`` can recompute it at any time and
compare.
"""

import csv
import hashlib
import io
import json
from datetime import date, datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import Conflict, InvalidInput
from tenants.billing.periods import month_bounds, month_start, next_month
from tenants.billing.points import _draw_points
from tenants.billing.rates import _cards_for, _currency, _uncovered
from tenants.billing.rating import Line, price_lines, usage_seconds
from tenants.billing.rounding import AMOUNT_QUANTUM, _quantize
from tenants.models import Invoice, PointsEntry, Project

DOCUMENT_FORMAT = "kumo.invoice/1"
ROUNDING_RULE = (
    "exact Decimal arithmetic; each line amount rounded once half-to-even to 0.01, "
    "quantities to 0.000001; total = sum of rounded line amounts; storage GiB-month = 730 h"
)


def invoice_document(
    project: Project, period: date, lines: list[Line], currency: str
) -> tuple[str, Decimal]:
    """The canonical JSON of an invoice, and its total."""
    total = sum((li.amount for li in lines), Decimal("0.00"))
    doc = {
        "format": DOCUMENT_FORMAT,
        "project": project.slug,
        "period": {"start": period.isoformat(), "end": next_month(period).isoformat()},
        "currency": currency,
        "rounding": ROUNDING_RULE,
        "rate_cards": sorted({li.rate_card for li in lines}),
        "lines": [li.as_dict() for li in lines],
        "total": str(_quantize(total, AMOUNT_QUANTUM)),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text, _quantize(total, AMOUNT_QUANTUM)


CSV_COLUMNS = [
    "resource",
    "model",
    "priority",
    "rate_card",
    "unit",
    "quantity",
    "unit_price",
    "factor",
    "amount",
]


def invoice_csv(document: str) -> str:
    """The CSV of an invoice document: a header, one row per line, a total row. Derived
    from the canonical JSON alone, so it is as reproducible as the JSON."""
    doc = json.loads(document)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["# project", doc["project"], "period", doc["period"]["start"]])
    writer.writerow(CSV_COLUMNS)
    for line in doc["lines"]:
        writer.writerow([line[c] for c in CSV_COLUMNS])
    writer.writerow(["total", "", "", "", doc["currency"], "", "", "", doc["total"]])
    return out.getvalue()


def content_hash(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


def _period_cards(period: date, *, strict: bool) -> tuple[datetime, datetime, dict]:
    start, end = month_bounds(period)
    cards = _cards_for(start, end)
    if strict:
        gap = _uncovered(cards, start, end)
        if gap is not None:
            raise Conflict(
                f"no rate card is valid at {gap.isoformat()}; create one first",
                code="no_rate_card",
                details={"period": [f"no rate card at {gap.isoformat()}"]},
            )
    return start, end, {c.pk: c for c in cards}


def invoice_compute(project: Project, period: date) -> tuple[str, Decimal]:
    """The document and total ``project``'s invoice for ``period`` has from the usage and
    rate cards in the database now (nothing is written)."""
    start, end, cards = _period_cards(period, strict=True)
    sums = usage_seconds(start, end, project_ids=[project.pk]).get(project.pk, {})
    return invoice_document(project, period, price_lines(sums, cards), _currency(cards))


def invoice_verify(invoice: Invoice) -> dict:
    """Recompute ``invoice`` and compare: ``identical`` is true when the bytes match."""
    document, _total = invoice_compute(invoice.project, invoice.period_start)
    recomputed = content_hash(document)
    return {
        "stored_hash": invoice.content_hash,
        "recomputed_hash": recomputed,
        "identical": recomputed == invoice.content_hash and document == invoice.document,
    }


@transaction.atomic
def invoices_issue(
    *, period: date, projects: list[Project] | None = None, actor=None, now: datetime | None = None
) -> list[Invoice]:
    """Issue the invoices of ``period`` (a month that has ended) for ``projects``, or for
    every project with usage in it. Rated in one aggregate query for all of them. A project
    already invoiced for the period keeps its invoice (issuing again changes nothing); a
    project holding prepaid points pays from them first (a ledger debit). Returns the new
    invoices."""
    now = now or timezone.now()
    period = month_start(period)
    start, end, cards = _period_cards(period, strict=True)
    if end > now:
        raise InvalidInput.field("period", f"{period:%Y-%m} has not ended yet")
    ids = [p.pk for p in projects] if projects is not None else None
    sums = usage_seconds(start, end, project_ids=ids)
    wanted = set(sums) if ids is None else set(ids)
    done = set(
        Invoice.objects.filter(period_start=period, project_id__in=wanted).values_list(
            "project_id", flat=True
        )
    )
    todo = sorted(wanted - done)
    by_id = {p.pk: p for p in Project.objects.filter(pk__in=todo)}
    currency = _currency(cards)
    issued_by = actor if getattr(actor, "is_authenticated", False) else None
    invoices = []
    for pid in todo:
        document, total = invoice_document(
            by_id[pid], period, price_lines(sums.get(pid, {}), cards), currency
        )
        invoices.append(
            Invoice(
                project_id=pid,
                period_start=period,
                period_end=next_month(period),
                currency=currency,
                total=total,
                points_applied=Decimal(0),
                amount_due=total,
                document=document,
                content_hash=content_hash(document),
                issued_at=now,
                issued_by=issued_by,
            )
        )
    try:
        with transaction.atomic():
            Invoice.objects.bulk_create(invoices)
    except IntegrityError:
        raise Conflict("invoices of this period were issued meanwhile; try again") from None
    for invoice in invoices:  # bulk_create set their ids (PostgreSQL and SQLite return them)
        invoice.project = by_id[invoice.project_id]
    with_points = set(
        PointsEntry.objects.filter(project_id__in=todo)
        .values_list("project_id", flat=True)
        .distinct()
    )
    for invoice in invoices:
        if invoice.project_id in with_points and invoice.total > 0:
            _draw_points(invoice, actor=issued_by)
    _audit_issued(invoices, period)
    return invoices


def _audit_issued(invoices: list[Invoice], period: date) -> None:
    """One ``invoice.issue`` audit event per invoice, as ``audit.record`` writes them, in
    one INSERT (a thousand invoices would otherwise cost a thousand round trips)."""
    from controlplane.models import AuditEvent

    ctx = audit.current()
    actor = ctx.actor if getattr(ctx.actor, "is_authenticated", False) else None
    AuditEvent.objects.bulk_create(
        AuditEvent(
            actor=actor,
            actor_name=actor.get_username() if actor else ctx.source,
            source=ctx.source,
            action="invoice.issue",
            object_type=Invoice._meta.label_lower,
            object_id=str(invoice.pk),
            object_repr=str(invoice)[:200],
            project=invoice.project,
            project_slug=invoice.project.slug,
            ip_address=ctx.ip_address,
            outcome=AuditOutcome.SUCCESS,
            detail={
                "period": f"{period:%Y-%m}",
                "total": str(invoice.total),
                "points_applied": str(invoice.points_applied),
                "content_hash": invoice.content_hash,
            },
            request_id=ctx.request_id,
        )
        for invoice in invoices
    )
