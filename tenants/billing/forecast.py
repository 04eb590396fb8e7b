"""The forecast: a project's spend this month so far and projected to the month's end."""

from datetime import UTC, datetime
from decimal import Decimal

from django.utils import timezone

from tenants.billing.periods import month_bounds
from tenants.billing.points import points_balance
from tenants.billing.rates import _cards_for, _currency
from tenants.billing.rating import price_lines, usage_seconds
from tenants.billing.rounding import _quantize
from tenants.models import Budget, Project


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
