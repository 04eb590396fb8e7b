"""Billing's rounding rule, stated on every invoice (``invoices.ROUNDING_RULE``): computed
exactly with 60 significant digits, each line's ``amount`` is rounded once, half to even, to
0.01 of the currency, its ``quantity`` to 0.000001; the total is the sum of the rounded
line amounts. Prices are kept to 0.000001 and priority factors to 0.0001."""

from decimal import ROUND_HALF_EVEN, Decimal

AMOUNT_QUANTUM = Decimal("0.01")
QUANTITY_QUANTUM = Decimal("0.000001")
PRICE_QUANTUM = Decimal("0.000001")
FACTOR_QUANTUM = Decimal("0.0001")


def _quantize(value: Decimal, quantum: Decimal) -> Decimal:
    return Decimal(value).quantize(quantum, rounding=ROUND_HALF_EVEN)
