"""Rating: usage intervals into priced lines.

An invoice covers one calendar month in UTC, ``[first day, first day of next month)``.
Every usage interval overlapping the month is clipped to it (an open interval counts up to
the month's end for an invoice, up to now for the spend so far), then split at the
boundaries of the rate card versions valid during it; per (resource, GPU model, priority,
rate card) the database sums ``quantity x seconds`` exactly (numeric, to the microsecond)
in one aggregate query. Python then prices each sum with Decimal:

- ``quantity`` (unit-hours; storage: GiB-months) = seconds-sum / 3600 (storage:
  / (730 x 3600): a billing month is 730 hours whatever the calendar month's length);
- ``amount`` = seconds-sum x unit price x priority factor / the same divisor;

each rounded as ``tenants.billing.rounding`` says.
"""

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, localcontext

from django.db import connection, transaction

from controlplane.errors import Conflict
from tenants.billing.rates import _cards_for
from tenants.billing.rounding import (
    AMOUNT_QUANTUM,
    FACTOR_QUANTUM,
    PRICE_QUANTUM,
    QUANTITY_QUANTUM,
    _quantize,
)
from tenants.choices import UsageResource
from tenants.models import RateCard, UsageRecord

HOURS_PER_BILLING_MONTH = 730
UNITS = {
    UsageResource.VCPU: "vCPU-hour",
    UsageResource.MEMORY: "GiB-hour",
    UsageResource.GPU: "GPU-hour",
    UsageResource.STORAGE: "GiB-month",
    UsageResource.GLOBAL_IP: "IP-hour",
}


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
