"""The admin console for billing: pages render, rate cards and points are added through the
services (audited, chained), invoices are recomputed on demand, nothing is edited by hand."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.admin.sites import site
from django.urls import reverse

from controlplane.models import AuditEvent
from tenants import billing
from tenants.models import (
    Budget,
    BudgetAlert,
    Invoice,
    PointsEntry,
    RateCard,
    UsageRecord,
)
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PRICES = [
    {"resource": r, "unit_price": "1"} for r in ("vcpu", "memory", "gpu", "storage", "global_ip")
]
MODELS = [RateCard, UsageRecord, Invoice, Budget, BudgetAlert, PointsEntry]


@pytest.fixture
def operator(client):
    user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


@pytest.fixture
def invoice(project):
    billing.rate_card_create(valid_from=datetime(2025, 1, 1, tzinfo=UTC), prices=PRICES)
    start = datetime(2025, 2, 1, tzinfo=UTC)
    UsageRecord.objects.create(
        project=project,
        subject_type="tests.subject",
        subject_id="1",
        resource="vcpu",
        quantity=2,
        started_at=start,
        ended_at=start + timedelta(hours=3),
    )
    billing.budget_create(project=project, name="b", amount=Decimal(10))
    [made] = billing.invoices_issue(period=date(2025, 2, 1), projects=[project])
    return made


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_page_renders(operator, invoice, model):
    assert model in site._registry
    meta = model._meta
    assert (
        operator.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")).status_code
        == 200
    )
    obj = model.objects.first()
    if obj is not None:
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
        assert operator.get(url).status_code == 200


def test_a_rate_card_is_added_through_the_service(operator):
    first = billing.rate_card_create(valid_from=datetime(2025, 1, 1, tzinfo=UTC), prices=PRICES)
    response = operator.post(
        reverse("admin:tenants_ratecard_add"),
        {
            "valid_from_0": "2026-05-01",
            "valid_from_1": "00:00:00",
            "currency": "JPY",
            "spot_factor": "0.3",
            "reserved_factor": "0.7",
            "notes": "FY2026",
            "prices_text": "vcpu 12\nmemory 2\ngpu 300\ngpu A100-SXM4-40GB 520\n"
            "storage 8\nglobal_ip 3",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    card = RateCard.objects.get(version=2)
    first.refresh_from_db()
    assert first.valid_until == card.valid_from
    assert card.prices.get(resource="gpu", model="A100-SXM4-40GB").unit_price == Decimal(520)
    assert AuditEvent.objects.filter(action="rate_card.create", object_id=str(card.pk)).exists()


def test_a_rate_card_missing_prices_is_refused_with_the_reason(operator):
    response = operator.post(
        reverse("admin:tenants_ratecard_add"),
        {
            "valid_from_0": "2026-05-01",
            "valid_from_1": "00:00:00",
            "currency": "JPY",
            "spot_factor": "0.3",
            "reserved_factor": "0.7",
            "prices_text": "vcpu 12",
        },
        follow=True,
    )
    assert "missing a price" in response.content.decode()
    assert RateCard.objects.count() == 0


def test_verify_recomputes_invoices(operator, invoice):
    response = operator.post(
        reverse("admin:tenants_invoice_changelist"),
        {"action": "verify", "_selected_action": [invoice.pk]},
        follow=True,
    )
    assert "identical" in response.content.decode()


def test_points_are_credited_through_the_service(operator, project):
    response = operator.post(
        reverse("admin:tenants_pointsentry_add"),
        {"project": project.pk, "kind": "credit", "amount": "250", "note": "grant"},
    )
    assert response.status_code == 302
    assert billing.points_balance(project) == Decimal(250)
    assert AuditEvent.objects.filter(action="points.credit").exists()
