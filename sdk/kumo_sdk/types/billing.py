"""Usage, invoices, the forecast, budgets, points and rate cards."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any


@dataclass(frozen=True)
class UsageRecord:
    """One interval of use of a resource; ``ended_at`` is None while it is still in use.
    ``quantity`` is a decimal string, as the server sends it."""

    id: int
    resource: str
    started_at: datetime
    subject_type: str = ""
    subject_id: str = ""
    subject_name: str = ""
    model: str = ""
    priority: str = ""
    quantity: str = ""
    ended_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Invoice:
    """A month's invoice. Amounts are decimal strings, exactly as the server sends them."""

    id: int
    period_start: date
    period_end: date
    project: str = ""
    currency: str = ""
    total: str = ""
    points_applied: str = ""
    amount_due: str = ""
    content_hash: str = ""
    issued_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class InvoiceVerification:
    """An invoice recomputed: its stored hash, the recomputed one, and whether they match."""

    stored_hash: str = ""
    recomputed_hash: str = ""
    identical: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ForecastLine:
    resource: str
    model: str = ""
    priority: str = ""
    rate_card: int | None = None
    unit: str = ""
    quantity: str = ""
    unit_price: str = ""
    factor: str = ""
    amount: str = ""


@dataclass(frozen=True)
class ForecastBudget:
    name: str
    amount: str = ""
    spent_percent: str = ""
    projected_percent: str = ""


@dataclass(frozen=True)
class Forecast:
    """This month's spend so far and projected to the month's end (decimal strings), the
    points balance, each active budget's share and the projected invoice's lines."""

    period_start: date
    period_end: date
    at: datetime | None = None
    currency: str = ""
    so_far: str = ""
    projected: str = ""
    points_balance: str = ""
    budgets: list[ForecastBudget] = field(default_factory=list)
    lines: list[ForecastLine] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Budget:
    """A monthly budget: alerts at each threshold (percent), and the policy at 100 %."""

    id: int = 0
    name: str = ""
    amount: str = ""
    thresholds: list[int] = field(default_factory=list)
    policy: str = ""
    active: bool = False
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class PointsEntry:
    """One entry of the prepaid points ledger, with the balance after it."""

    id: int = 0
    kind: str = ""
    amount: str = ""
    balance_after: str = ""
    invoice: int | None = None
    note: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class OperatorPointsEntry:
    """A points ledger entry as operators see it, with its project."""

    id: int = 0
    project: str = ""
    kind: str = ""
    amount: str = ""
    balance_after: str = ""
    invoice: int | None = None
    note: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RateCardPrice:
    """One price of a rate card: per unit of ``resource`` (for a GPU model, if given)."""

    resource: str = ""
    model: str = ""
    unit_price: str = ""


@dataclass(frozen=True)
class RateCard:
    """A version of the rate card, in force from ``valid_from`` (never edited)."""

    id: int = 0
    version: int = 0
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    currency: str = ""
    spot_factor: str = ""
    reserved_factor: str = ""
    held_factor: str = ""
    notes: str = ""
    prices: list[RateCardPrice] = field(default_factory=list)
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
