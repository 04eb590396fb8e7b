"""Usage, the forecast, invoices, budgets and points."""

from __future__ import annotations

from kumo_sdk.resource import CRUD, READ, Resource, Singleton
from kumo_sdk.types import (
    Budget,
    Forecast,
    Invoice,
    InvoiceVerification,
    PointsEntry,
    UsageRecord,
    decode,
)


class Usage(Resource[UsageRecord]):
    """What the project used (``list``) and this month's ``forecast``. ``list`` filters:
    ``resource``, ``priority``, ``subject_type``, ``subject_id``, ``open`` (still in use),
    ``started_after``, ``started_before`` (datetimes or ISO 8601 strings), ``ordering``."""

    path, type, find_by, verbs = "usage-records/", UsageRecord, None, READ

    def forecast(self, *, project: str | None = None) -> Forecast:
        return self._c.forecast.get(project=project)


class ForecastReport(Singleton[Forecast]):
    """This month's spend so far and projected, the points balance and budgets' shares."""

    path, type = "forecast/", Forecast


class Invoices(Resource[Invoice]):
    """A project's monthly invoices; ``list`` filters: ``period_start`` (a month's first day,
    ISO 8601), ``ordering``."""

    path, type, find_by, verbs = "invoices/", Invoice, None, READ

    def download(
        self, invoice_id: int, *, format: str = "csv", project: str | None = None
    ) -> bytes:
        """The invoice's document as bytes: ``csv`` (a header, the lines, a total row) or
        ``json`` (its canonical document, the bytes ``content_hash`` is the SHA-256 of)."""
        if format not in ("csv", "json"):
            raise ValueError(f"format must be csv or json, not {format!r}")
        return self._c.request("GET", f"{self._item(invoice_id, project)}{format}/").content

    def verify(self, invoice_id: int, *, project: str | None = None) -> InvoiceVerification:
        """Recompute the invoice and compare it, byte for byte, with the one issued."""
        path = f"{self._item(invoice_id, project)}verify/"
        return decode(InvoiceVerification, self._c.get(path))


class Budgets(Resource[Budget]):
    """Monthly budgets (admins): ``create(name, amount=..., thresholds=[50, 80, 100],
    policy="notify"|"stop_spot"|"stop_all")``; each threshold alerts once a month, and at
    100 % the policy applies."""

    path, type, verbs = "budgets/", Budget, CRUD


class Points(Resource[PointsEntry]):
    """The prepaid points ledger: credits, adjustments and invoice debits, each with the
    balance after it (operators grant points: ``kumo.admin.points``)."""

    path, type, find_by, verbs, noun = "points/", PointsEntry, None, READ, "points entry"
