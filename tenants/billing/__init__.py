"""Billing: rate cards, rating usage into invoices, forecasts, budgets and prepaid points.

One module per part, each importing only those before it in this list:

- ``rounding``: the rounding rule and its quanta (exact Decimal, half to even, once a line);
- ``periods``: billing months in UTC and ``YYYY-MM`` parsing;
- ``rates``: rate card versions (``rate_card_create``, ``rate_card_at``);
- ``rating``: usage intervals into ``quantity x seconds`` sums (one PostgreSQL aggregate)
  and priced lines (``usage_seconds``, ``price_lines``, ``spend``);
- ``points``: the prepaid points ledger (``points_credit``, ``points_balance``);
- ``invoices``: canonical invoice documents, their CSV, issuing and verifying;
- ``forecast``: the month's spend so far and projected;
- ``budgets``: budgets, their thresholds and the beat check (``budgets_check``).

Usage intervals themselves are written by ``tenants.usage``. Stopping the VMs of a project
over a budget that says so is compute's (``compute.services.reclaim.budget_reclaim``):
billing decides when, compute writes its VMs. Every write here runs in one transaction with
its audit event.

Callers import this package (``from tenants import billing``), which re-exports every public
name of its modules. A name is bound where it is imported: to patch what a function calls,
patch it in that function's module (``tenants.billing.invoices.usage_seconds``).
"""

from tenants.billing.budgets import (
    DEFAULT_THRESHOLDS,
    budget_create,
    budget_delete,
    budget_update,
    budgets_check,
)
from tenants.billing.forecast import forecast
from tenants.billing.invoices import (
    CSV_COLUMNS,
    DOCUMENT_FORMAT,
    ROUNDING_RULE,
    content_hash,
    invoice_compute,
    invoice_csv,
    invoice_document,
    invoice_verify,
    invoices_issue,
)
from tenants.billing.periods import month_bounds, month_start, next_month, parse_period
from tenants.billing.points import points_balance, points_credit
from tenants.billing.rates import REQUIRED_PRICES, rate_card_at, rate_card_create
from tenants.billing.rating import (
    HOURS_PER_BILLING_MONTH,
    RATING_WORK_MEM,
    UNITS,
    Key,
    Line,
    price_lines,
    spend,
    usage_seconds,
)
from tenants.billing.rounding import (
    AMOUNT_QUANTUM,
    FACTOR_QUANTUM,
    PRICE_QUANTUM,
    QUANTITY_QUANTUM,
    _quantize,  # the tests check rounded amounts with billing's own rounding
)


def __getattr__(name: str):
    # ``billing.budget_reclaim`` still names the over-budget stopping, now compute's; looked
    # up on use, since compute imports tenants and tenants must not import compute at load.
    if name == "budget_reclaim":
        from compute.services.reclaim import budget_reclaim

        return budget_reclaim
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AMOUNT_QUANTUM",
    "CSV_COLUMNS",
    "DEFAULT_THRESHOLDS",
    "DOCUMENT_FORMAT",
    "FACTOR_QUANTUM",
    "HOURS_PER_BILLING_MONTH",
    "PRICE_QUANTUM",
    "QUANTITY_QUANTUM",
    "RATING_WORK_MEM",
    "REQUIRED_PRICES",
    "ROUNDING_RULE",
    "UNITS",
    "Key",
    "Line",
    "_quantize",
    "budget_create",
    "budget_delete",
    "budget_update",
    "budgets_check",
    "content_hash",
    "forecast",
    "invoice_compute",
    "invoice_csv",
    "invoice_document",
    "invoice_verify",
    "invoices_issue",
    "month_bounds",
    "month_start",
    "next_month",
    "parse_period",
    "points_balance",
    "points_credit",
    "price_lines",
    "rate_card_at",
    "rate_card_create",
    "spend",
    "usage_seconds",
]
