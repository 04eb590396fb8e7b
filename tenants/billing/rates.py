"""Rate cards: versioned price lists; a version is valid from its ``valid_from`` until the
next one starts (``rate_card_create`` appends a version and ends the one before)."""

from datetime import UTC, datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from tenants.billing.rounding import FACTOR_QUANTUM, PRICE_QUANTUM, _quantize
from tenants.choices import UsageResource
from tenants.models import Invoice, RateCard, RateCardPrice

REQUIRED_PRICES = [
    (UsageResource.VCPU, ""),
    (UsageResource.MEMORY, ""),
    (UsageResource.GPU, ""),
    (UsageResource.STORAGE, ""),
    (UsageResource.GLOBAL_IP, ""),
]


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


def _currency(cards: dict) -> str:
    currencies = {c.currency for c in cards.values()}
    return currencies.pop() if len(currencies) == 1 else "JPY"
