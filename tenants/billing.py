"""Billing: rate cards, rating usage into invoices, forecasts, budgets and prepaid points.

Rating
    An invoice covers one calendar month in UTC, ``[first day, first day of next month)``.
    Every usage interval overlapping the month is clipped to it (an open interval counts
    up to the month's end for an invoice, up to now for the spend so far), then split at
    the boundaries of the rate card versions valid during it; per (resource, GPU model,
    priority, rate card) the database sums ``quantity x seconds`` exactly (numeric, to the
    microsecond) in one aggregate query. Python then prices each sum with Decimal:

    - ``quantity`` (unit-hours; storage: GiB-months) = seconds-sum / 3600 (storage:
      / (730 x 3600): a billing month is 730 hours whatever the calendar month's length);
    - ``amount`` = seconds-sum x unit price x priority factor / the same divisor.

Rounding rule (stated on every invoice): computed exactly with 60 significant digits,
    each line's ``amount`` is rounded once, half to even, to 0.01 of the currency, its
    ``quantity`` to 0.000001; the total is the sum of the rounded line amounts.

Reproducibility
    The invoice document is canonical JSON (sorted keys, no spaces, ASCII, every number a
    string with fixed places, lines in a fixed order, no timestamp of its making); the CSV
    is derived from it. The same intervals and rate cards give the same bytes, and the
    invoice stores the SHA-256 of the JSON, so ``invoice_verify`` can recompute it at any
    time and compare.

Every write here runs in one transaction with its audit event.
"""

import csv
import hashlib
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from controlplane import audit, events
from controlplane.choices import AuditOutcome
from controlplane.errors import Conflict, InvalidInput
from tenants.choices import BudgetPolicy, PointsKind, UsageResource
from tenants.models import (
    Budget,
    BudgetAlert,
    Invoice,
    PointsEntry,
    Project,
    RateCard,
    RateCardPrice,
    UsageRecord,
)

DOCUMENT_FORMAT = "kumo.invoice/1"
ROUNDING_RULE = (
    "exact Decimal arithmetic; each line amount rounded once half-to-even to 0.01, "
    "quantities to 0.000001; total = sum of rounded line amounts; storage GiB-month = 730 h"
)
AMOUNT_QUANTUM = Decimal("0.01")
QUANTITY_QUANTUM = Decimal("0.000001")
PRICE_QUANTUM = Decimal("0.000001")
FACTOR_QUANTUM = Decimal("0.0001")
HOURS_PER_BILLING_MONTH = 730
REQUIRED_PRICES = [
    (UsageResource.VCPU, ""),
    (UsageResource.MEMORY, ""),
    (UsageResource.GPU, ""),
    (UsageResource.STORAGE, ""),
    (UsageResource.GLOBAL_IP, ""),
]
UNITS = {
    UsageResource.VCPU: "vCPU-hour",
    UsageResource.MEMORY: "GiB-hour",
    UsageResource.GPU: "GPU-hour",
    UsageResource.STORAGE: "GiB-month",
    UsageResource.GLOBAL_IP: "IP-hour",
}
DEFAULT_THRESHOLDS = [50, 80, 100]


# --- periods ----------------------------------------------------------------------------------


def month_start(day: date) -> date:
    return day.replace(day=1)


def next_month(day: date) -> date:
    day = month_start(day)
    return (
        day.replace(year=day.year + 1, month=1)
        if day.month == 12
        else day.replace(month=day.month + 1)
    )


def month_bounds(day: date) -> tuple[datetime, datetime]:
    """The UTC instants ``[start, end)`` of the calendar month holding ``day``."""
    start = month_start(day)
    end = next_month(start)
    return (
        datetime(start.year, start.month, 1, tzinfo=UTC),
        datetime(end.year, end.month, 1, tzinfo=UTC),
    )


def parse_period(value: str, field: str = "period") -> date:
    """``YYYY-MM`` (or a date in the month) to the month's first day; 400 naming ``field``."""
    try:
        if len(value) == 7:
            return date(int(value[:4]), int(value[5:7]), 1)
        return month_start(date.fromisoformat(value))
    except (TypeError, ValueError):
        raise InvalidInput.field(field, "must be a month, YYYY-MM") from None


# --- rate cards ---------------------------------------------------------------------------------


def _quantize(value: Decimal, quantum: Decimal) -> Decimal:
    return Decimal(value).quantize(quantum, rounding=ROUND_HALF_EVEN)


@transaction.atomic
def rate_card_create(
    *,
    valid_from: datetime,
    prices: list[dict],
    spot_factor: Decimal = Decimal("0.3"),
    reserved_factor: Decimal = Decimal("0.7"),
    held_factor: Decimal = Decimal("0.5"),
    currency: str = "JPY",
    notes: str = "",
    actor=None,
) -> RateCard:
    """Append a rate card version valid from ``valid_from`` on; the version before it ends
    there. Refused (400, naming the field) when it would start before or with the current
    last version, inside a month already invoiced, in another currency, or without a price
    for each of vCPU, memory, a default GPU (model ""), storage and global IP."""
    if timezone.is_naive(valid_from):
        raise InvalidInput.field("valid_from", "must carry a time zone")
    seen: dict[tuple[str, str], Decimal] = {}
    for index, item in enumerate(prices):
        resource, model = item.get("resource"), item.get("model", "") or ""
        if resource not in UsageResource.values:
            raise InvalidInput.field("prices", f"[{index}]: unknown resource {resource!r}")
        if model and resource != UsageResource.GPU:
            raise InvalidInput.field("prices", f"[{index}]: only GPU prices name a model")
        try:
            price = Decimal(str(item.get("unit_price")))
        except ArithmeticError:
            raise InvalidInput.field("prices", f"[{index}]: unit_price is not a number") from None
        if not price.is_finite() or price < 0 or price >= Decimal(10) ** 14:
            raise InvalidInput.field("prices", f"[{index}]: unit_price must be 0 or more")
        if (resource, model) in seen:
            raise InvalidInput.field("prices", f"[{index}]: {resource} {model} priced twice")
        seen[(resource, model)] = _quantize(price, PRICE_QUANTUM)
    missing = [f"{r}{':' + m if m else ''}" for r, m in REQUIRED_PRICES if (r, m) not in seen]
    if missing:
        raise InvalidInput.field("prices", f"missing a price for {', '.join(missing)}")
    factors = (
        ("spot_factor", spot_factor),
        ("reserved_factor", reserved_factor),
        ("held_factor", held_factor),
    )
    for name, factor in factors:
        if not Decimal(factor).is_finite() or not 0 <= Decimal(factor) <= 10:
            raise InvalidInput.field(name, "must be between 0 and 10")
    latest = RateCard.objects.select_for_update().order_by("-version").first()
    if latest is not None:
        if valid_from <= latest.valid_from:
            raise InvalidInput.field(
                "valid_from",
                f"must be after {latest.valid_from.isoformat()}, when version "
                f"{latest.version} starts",
            )
        if currency != latest.currency:
            raise InvalidInput.field("currency", f"rate cards are in {latest.currency}")
    invoiced = Invoice.objects.aggregate(end=Max("period_end"))["end"]
    if invoiced is not None and valid_from < datetime(invoiced.year, invoiced.month, 1, tzinfo=UTC):
        raise InvalidInput.field(
            "valid_from", f"months before {invoiced:%Y-%m} are invoiced; start on or after it"
        )
    try:
        with transaction.atomic():
            if latest is not None:
                RateCard.objects.filter(pk=latest.pk).update(valid_until=valid_from)
            card = RateCard.objects.create(
                version=(latest.version + 1) if latest else 1,
                valid_from=valid_from,
                currency=currency,
                spot_factor=_quantize(Decimal(spot_factor), FACTOR_QUANTUM),
                reserved_factor=_quantize(Decimal(reserved_factor), FACTOR_QUANTUM),
                held_factor=_quantize(Decimal(held_factor), FACTOR_QUANTUM),
                notes=notes[:500],
                created_by=actor if getattr(actor, "is_authenticated", False) else None,
            )
    except IntegrityError:
        raise Conflict("another rate card version was created meanwhile; try again") from None
    RateCardPrice.objects.bulk_create(
        RateCardPrice(card=card, resource=r, model=m, unit_price=p) for (r, m), p in seen.items()
    )
    audit.record(
        "rate_card.create",
        card,
        detail={
            "version": card.version,
            "valid_from": valid_from.isoformat(),
            "prices": {f"{r}{':' + m if m else ''}": str(p) for (r, m), p in seen.items()},
            "spot_factor": str(card.spot_factor),
            "reserved_factor": str(card.reserved_factor),
            "held_factor": str(card.held_factor),
        },
    )
    return card


def rate_card_at(at: datetime) -> RateCard | None:
    """The version valid at ``at`` (None before the first one)."""
    return (
        RateCard.objects.filter(valid_from__lte=at)
        .exclude(valid_until__lte=at)
        .prefetch_related("prices")
        .first()
    )


def _cards_for(start: datetime, end: datetime) -> list[RateCard]:
    return list(
        RateCard.objects.filter(valid_from__lt=end)
        .exclude(valid_until__lte=start)
        .prefetch_related("prices")
        .order_by("valid_from")
    )


def _uncovered(cards: list[RateCard], start: datetime, end: datetime) -> datetime | None:
    """The first instant of ``[start, end)`` no card covers, or None."""
    at = start
    for card in cards:
        if card.valid_from > at:
            return at
        at = end if card.valid_until is None else max(at, card.valid_until)
        if at >= end:
            return None
    return at if at < end else None


# --- rating -------------------------------------------------------------------------------------

# One aggregate over the intervals overlapping [start, end), grouped as plainly as a usage
# report is (project, resource, model, priority), in one scan that PostgreSQL runs in
# parallel. Each interval is clipped to the period (open ones end at open_until). Splitting
# at the rate cards' boundaries b1 < b2 < … inside the period costs one more sum per
# boundary, not a join: F_j = SUM(quantity x seconds of [s, min(b_j, e))) over the intervals
# starting before b_j, the part of the usage before b_j; segment k then holds F_{k+1} - F_k
# (F_0 = 0, F_last = the whole). EXTRACT(EPOCH FROM interval) is numeric, exact to the microsecond.
_RATE_SQL = """
SELECT project_id, resource, model, priority,
       SUM(quantity * EXTRACT(EPOCH FROM e - s)){before}
FROM (
    SELECT project_id, resource, model, priority, quantity,
           GREATEST(started_at, %(start)s) AS s,
           LEAST(COALESCE(ended_at, %(open_until)s), %(end)s) AS e
    FROM tenants_usagerecord
    WHERE started_at < %(end)s AND (ended_at IS NULL OR ended_at > %(start)s) {projects}
) AS u
WHERE e > s
GROUP BY project_id, resource, model, priority
"""
_BEFORE_SQL = (
    ",\n       SUM(quantity * EXTRACT(EPOCH FROM LEAST(%(b{j})s, e) - s))"
    " FILTER (WHERE s < %(b{j})s)"
)
# The sums' states outgrow the default work_mem, and PostgreSQL would then sort the rows
# instead of hashing them in parallel (2 to 3 times slower): the rating transaction gets
# this much, for its own duration only.
RATING_WORK_MEM = "64MB"

Key = tuple[str, str, str, int]  # resource, model, priority, card id


def _segments(start: datetime, end: datetime) -> tuple[list[datetime], list[int | None]]:
    """The boundaries strictly inside ``[start, end)`` where the valid rate card changes (or
    a gap in the cards begins or ends), and the card id of each of the segments they make
    (None for a gap: usage there is not rated)."""
    cards = list(
        RateCard.objects.filter(valid_from__lt=end)
        .exclude(valid_until__lte=start)
        .order_by("valid_from")
        .values_list("pk", "valid_from", "valid_until")
    )
    edges = {start, end}
    for _pk, valid_from, valid_until in cards:
        edges |= {t for t in (valid_from, valid_until) if t is not None and start < t < end}
    edges = sorted(edges)
    owners = []
    for at in edges[:-1]:
        owners.append(
            next(
                (pk for pk, vf, vu in cards if vf <= at and (vu is None or at < vu)),
                None,
            )
        )
    return edges[1:-1], owners


def usage_seconds(
    start: datetime,
    end: datetime,
    *,
    open_until: datetime | None = None,
    project_ids: list[int] | None = None,
    in_python: bool = False,
) -> dict[int, dict[Key, Decimal]]:
    """Per project, ``quantity x seconds`` of usage in ``[start, end)`` per (resource, model,
    priority, rate card id). Open intervals count up to ``open_until`` (default ``end``);
    usage where no rate card is valid is left out.

    On PostgreSQL one aggregate query does it; elsewhere (or with ``in_python``, the
    reference the tests compare it with) the same arithmetic runs over the rows in Python.
    """
    open_until = open_until or end
    if connection.vendor != "postgresql" or in_python:
        return _usage_seconds_python(start, end, open_until, project_ids)
    boundaries, owners = _segments(start, end)
    params: dict = {"start": start, "end": end, "open_until": open_until}
    params |= {f"b{j}": b for j, b in enumerate(boundaries, start=1)}
    projects = ""
    if project_ids is not None:
        projects, params["projects"] = "AND project_id = ANY(%(projects)s)", list(project_ids)
    before = "".join(_BEFORE_SQL.format(j=j) for j in range(1, len(boundaries) + 1))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL work_mem = '{RATING_WORK_MEM}'")
        cursor.execute(_RATE_SQL.format(before=before, projects=projects), params)
        rows = cursor.fetchall()
    result: dict[int, dict[Key, Decimal]] = defaultdict(dict)
    for project_id, resource, model, priority, whole, *parts in rows:
        cumulative = [Decimal(0), *(Decimal(p or 0) for p in parts), Decimal(whole or 0)]
        for k, card_id in enumerate(owners):
            qsec = cumulative[k + 1] - cumulative[k]
            if card_id is not None and qsec:
                result[project_id][(resource, model, priority, card_id)] = qsec
    return dict(result)


def _micro(delta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _usage_seconds_python(start, end, open_until, project_ids):
    cards = list(RateCard.objects.filter(valid_from__lt=end).exclude(valid_until__lte=start))
    rows = UsageRecord.objects.filter(started_at__lt=end).exclude(ended_at__lte=start)
    if project_ids is not None:
        rows = rows.filter(project_id__in=list(project_ids))
    result: dict[int, dict[Key, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    with localcontext() as ctx:
        ctx.prec = 60
        for r in rows.iterator():
            s = max(r.started_at, start)
            e = min(r.ended_at or open_until, end)
            if e <= s:
                continue
            for card in cards:
                cs = max(s, card.valid_from)
                ce = e if card.valid_until is None else min(e, card.valid_until)
                if ce > cs:
                    key = (r.resource, r.model, r.priority, card.pk)
                    seconds = Decimal(_micro(ce - cs)) / Decimal(1_000_000)
                    result[r.project_id][key] += r.quantity * seconds
    return {p: dict(v) for p, v in result.items()}


@dataclass(frozen=True)
class Line:
    resource: str
    model: str
    priority: str
    rate_card: int  # version
    unit: str
    quantity: Decimal
    unit_price: Decimal
    factor: Decimal
    amount: Decimal

    def as_dict(self) -> dict[str, str | int]:
        return {
            "resource": self.resource,
            "model": self.model,
            "priority": self.priority,
            "rate_card": self.rate_card,
            "unit": self.unit,
            "quantity": str(self.quantity),
            "unit_price": str(self.unit_price),
            "factor": str(self.factor),
            "amount": str(self.amount),
        }


def _price(card: RateCard, resource: str, model: str) -> Decimal:
    prices = getattr(card, "_price_map", None)
    if prices is None:
        prices = card._price_map = {(p.resource, p.model): p.unit_price for p in card.prices.all()}
    price = prices.get((resource, model))
    if price is None and resource == UsageResource.GPU:
        price = prices.get((resource, ""))
    if price is None:
        raise Conflict(
            f"rate card v{card.version} has no price for {resource} {model}".strip(),
            code="unpriced",
        )
    return price


def price_lines(seconds: dict[Key, Decimal], cards: dict[int, RateCard]) -> list[Line]:
    """Priced, rounded lines from ``usage_seconds``' sums, in the document's fixed order."""
    lines = []
    with localcontext() as ctx:
        ctx.prec = 60
        for (resource, model, priority, card_id), qsec in seconds.items():
            card = cards[card_id]
            divisor = Decimal(3600)
            if resource == UsageResource.STORAGE:
                divisor *= HOURS_PER_BILLING_MONTH
            price = _price(card, resource, model)
            factor = card.factor(priority)
            lines.append(
                Line(
                    resource=resource,
                    model=model,
                    priority=priority,
                    rate_card=card.version,
                    unit=UNITS[resource],
                    quantity=_quantize(qsec / divisor, QUANTITY_QUANTUM),
                    unit_price=_quantize(price, PRICE_QUANTUM),
                    factor=_quantize(factor, FACTOR_QUANTUM),
                    amount=_quantize(qsec * price * factor / divisor, AMOUNT_QUANTUM),
                )
            )
    lines.sort(key=lambda li: (li.resource, li.model, li.priority, li.rate_card))
    return lines


def spend(
    project_ids: list[int], start: datetime, end: datetime, *, open_until: datetime
) -> dict[int, Decimal]:
    """Per project, the rated cost of its usage in ``[start, end)`` with open intervals up
    to ``open_until``; rounded as on an invoice. Usage no rate card covers costs nothing."""
    cards = {c.pk: c for c in _cards_for(start, end)}
    sums = usage_seconds(start, end, open_until=open_until, project_ids=project_ids)
    return {
        pid: sum((li.amount for li in price_lines(sums.get(pid, {}), cards)), Decimal("0.00"))
        for pid in project_ids
    }


# --- invoice documents ---------------------------------------------------------------------------


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


def _currency(cards: dict) -> str:
    currencies = {c.currency for c in cards.values()}
    return currencies.pop() if len(currencies) == 1 else "JPY"


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


# --- prepaid points ------------------------------------------------------------------------------


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


# --- forecast ---------------------------------------------------------------------------------


def forecast(project: Project, *, now: datetime | None = None) -> dict:
    """The month's spend so far (usage up to ``now``) and projected to the month's end (open
    intervals extended to it, at the rate cards scheduled for then), with the points
    balance and each active budget's share."""
    now = now or timezone.now()
    start, end = month_bounds(now.astimezone(UTC).date())
    cards = {c.pk: c for c in _cards_for(start, end)}
    so_far_sums = usage_seconds(start, end, open_until=now, project_ids=[project.pk])
    projected_sums = usage_seconds(start, end, open_until=end, project_ids=[project.pk])
    so_far = sum(
        (li.amount for li in price_lines(so_far_sums.get(project.pk, {}), cards)), Decimal("0.00")
    )
    projected_lines = price_lines(projected_sums.get(project.pk, {}), cards)
    projected = sum((li.amount for li in projected_lines), Decimal("0.00"))
    budgets = [
        {
            "name": b.name,
            "amount": b.amount,
            "spent_percent": _percent(so_far, b.amount),
            "projected_percent": _percent(projected, b.amount),
        }
        for b in Budget.objects.for_project(project).filter(active=True)
    ]
    return {
        "period_start": start.date(),
        "period_end": end.date(),
        "at": now,
        "currency": _currency(cards),
        "so_far": so_far,
        "projected": projected,
        "points_balance": points_balance(project),
        "budgets": budgets,
        "lines": [li.as_dict() for li in projected_lines],
    }


def _percent(value: Decimal, of: Decimal) -> Decimal:
    return _quantize(value * 100 / of, Decimal("0.01")) if of else Decimal(0)


# --- budgets ------------------------------------------------------------------------------------


def _check_thresholds(thresholds) -> list[int]:
    if not isinstance(thresholds, list) or not thresholds:
        raise InvalidInput.field("thresholds", "must be a list of percentages, e.g. [50, 80, 100]")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= 1000 for t in thresholds):
        raise InvalidInput.field("thresholds", "each must be a whole percentage from 1 to 1000")
    if len(set(thresholds)) != len(thresholds):
        raise InvalidInput.field("thresholds", "must not repeat a percentage")
    return sorted(thresholds)


def _check_amount(amount) -> Decimal:
    amount = Decimal(amount)
    if not amount.is_finite() or amount <= 0 or amount >= Decimal(10) ** 13:
        raise InvalidInput.field("amount", "must be more than 0")
    return _quantize(amount, PRICE_QUANTUM)


@transaction.atomic
def budget_create(
    *,
    project: Project,
    name: str,
    amount: Decimal,
    thresholds: list[int] | None = None,
    policy: str = BudgetPolicy.NOTIFY,
    active: bool = True,
) -> Budget:
    """A monthly budget for ``project``; thresholds default to 50, 80 and 100 %."""
    thresholds = _check_thresholds(DEFAULT_THRESHOLDS if thresholds is None else thresholds)
    if policy not in BudgetPolicy.values:
        raise InvalidInput.field("policy", f"must be one of {', '.join(BudgetPolicy.values)}")
    if Budget.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a budget named {name} exists", details={"name": ["taken"]})
    budget = Budget.objects.create(
        project=project,
        name=name,
        amount=_check_amount(amount),
        thresholds=thresholds,
        policy=policy,
        active=active,
    )
    audit.record(
        "budget.create",
        budget,
        project=project,
        detail={"amount": str(budget.amount), "thresholds": thresholds, "policy": policy},
    )
    return budget


@transaction.atomic
def budget_update(*, budget: Budget, **changes) -> Budget:
    """Change a budget's name, amount, thresholds, policy or active flag. Alerts already
    sent this month stay sent."""
    unknown = set(changes) - {"name", "amount", "thresholds", "policy", "active"}
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "cannot be changed")
    budget = Budget.objects.select_for_update().get(pk=budget.pk)
    if "thresholds" in changes:
        changes["thresholds"] = _check_thresholds(changes["thresholds"])
    if "amount" in changes:
        changes["amount"] = _check_amount(changes["amount"])
    if "policy" in changes and changes["policy"] not in BudgetPolicy.values:
        raise InvalidInput.field("policy", f"must be one of {', '.join(BudgetPolicy.values)}")
    if (
        "name" in changes
        and Budget.objects.for_project(budget.project)
        .filter(name=changes["name"])
        .exclude(pk=budget.pk)
        .exists()
    ):
        raise Conflict(f"a budget named {changes['name']} exists", details={"name": ["taken"]})
    changed = {k: v for k, v in changes.items() if getattr(budget, k) != v}
    for k, v in changed.items():
        setattr(budget, k, v)
    if changed:
        budget.save()
        audit.record(
            "budget.update",
            budget,
            project=budget.project,
            detail={k: str(v) if isinstance(v, Decimal) else v for k, v in changed.items()},
        )
    return budget


@transaction.atomic
def budget_delete(*, budget: Budget) -> None:
    audit.record("budget.delete", budget, project=budget.project)
    budget.delete()


def budgets_check(*, now: datetime | None = None) -> dict:
    """Check every active budget against its project's month-to-date spend (beat).

    Each threshold crossed alerts exactly once per month: the ``BudgetAlert`` row's unique
    constraint decides which of several concurrent checks emits the ``budget.threshold``
    event (mailed to the project's admins and sent to its webhooks). A project at or over
    100 % of a budget whose policy stops VMs has its running spot VMs stopped first, then,
    with ``stop_all``, its other running VMs; each step is announced (``budget.reclaim``)
    before it happens, and audited. Compute does the stopping
    (``compute.services.reclaim.budget_reclaim``). Returns what it did."""
    now = now or timezone.now()
    start, end = month_bounds(now.astimezone(UTC).date())
    budgets = list(Budget.objects.filter(active=True).select_related("project"))
    spent = spend(sorted({b.project_id for b in budgets}), start, end, open_until=now)
    done = {"alerts": [], "stopped": []}
    for budget in budgets:
        amount_spent = spent.get(budget.project_id, Decimal(0))
        for threshold in budget.thresholds:
            crossed = amount_spent * 100 >= budget.amount * threshold
            if crossed and _alert_once(budget, start.date(), threshold, amount_spent):
                done["alerts"].append((budget.pk, threshold))
        if amount_spent >= budget.amount and budget.policy != BudgetPolicy.NOTIFY:
            # compute writes its VMs (and imports tenants, so only here, not at import time)
            from compute.services.reclaim import budget_reclaim

            done["stopped"] += budget_reclaim(budget=budget, spent=amount_spent)
    return done


def _alert_once(budget: Budget, period: date, threshold: int, spent: Decimal) -> bool:
    """Record and announce one threshold crossing; False when it was already recorded."""
    try:
        with transaction.atomic():
            alert = BudgetAlert.objects.create(
                budget=budget, period_start=period, threshold=threshold, spend=spent
            )
            message = (
                f"project {budget.project.slug} has spent {spent} of its "
                f"{budget.amount} budget {budget.name!r} this month: {threshold} % reached"
            )
            events.emit(
                "budget.threshold",
                project=budget.project,
                message=message,
                obj=budget,
                payload={
                    "budget": budget.name,
                    "threshold": threshold,
                    "amount": str(budget.amount),
                    "spent": str(spent),
                    "period": f"{period:%Y-%m}",
                },
                mail=True,
            )
            audit.record(
                "budget.threshold",
                alert,
                project=budget.project,
                detail={"budget": budget.name, "threshold": threshold, "spent": str(spent)},
            )
    except IntegrityError:
        return False
    return True
