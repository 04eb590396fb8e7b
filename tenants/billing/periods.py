"""Billing periods: calendar months in UTC, ``[first day, first day of next month)``."""

from datetime import UTC, date, datetime

from controlplane.errors import InvalidInput


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
