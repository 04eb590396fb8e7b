"""The billing API: isolation contracts for every project endpoint, downloads, the operators'
rate cards, invoice issuing and points, and bad input answered 400 naming the field."""

import itertools
import json
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_DOWN, Decimal

import pytest
from django.urls import reverse

from tenants import billing, usage
from tenants.choices import Role
from tenants.models import Budget, Invoice, PointsEntry, RateCard, UsageRecord
from tests.isolation import ProjectEndpointContract

pytestmark = pytest.mark.django_db

_seq = itertools.count(1)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PRICES = [
    {"resource": "vcpu", "unit_price": "10"},
    {"resource": "memory", "unit_price": "1.5"},
    {"resource": "gpu", "unit_price": "300"},
    {"resource": "storage", "unit_price": "7.3"},
    {"resource": "global_ip", "unit_price": "2"},
]


class Subject:
    class _meta:
        label_lower = "tests.subject"

    def __init__(self, project, pk):
        self.project_id, self.pk = project.pk, pk

    def __str__(self):
        return f"subject {self.pk}"


def used(project, hours=10, resource="vcpu", start=T0):
    subject = Subject(project, f"s{next(_seq)}")
    usage.usage_open(subject, resource, 1, start)
    return usage.usage_close(subject, resource, at=start + timedelta(hours=hours))


def issued(project, month=1):
    if not RateCard.objects.exists():
        billing.rate_card_create(valid_from=datetime(2025, 1, 1, tzinfo=UTC), prices=PRICES)
    used(project, start=datetime(2025, month, 1, tzinfo=UTC))
    [invoice] = billing.invoices_issue(period=date(2025, month, 1), projects=[project])
    return invoice


# --- isolation contracts ---------------------------------------------------------------------


class TestUsageRecordIsolation(ProjectEndpointContract):
    basename = "project-usagerecord"
    actions = ("list", "retrieve")

    def make_object(self, project):
        return usage.usage_open(Subject(project, f"iso{next(_seq)}"), "vcpu", 2, T0)

    def count(self, project):
        return UsageRecord.objects.for_project(project).count()


class TestInvoiceIsolation(ProjectEndpointContract):
    object_actions = (("get", "csv/"), ("get", "json/"), ("get", "verify/"))
    basename = "project-invoice"
    actions = ("list", "retrieve")

    def make_object(self, project):
        month = Invoice.objects.for_project(project).count() + 1
        return issued(project, month)

    def count(self, project):
        return Invoice.objects.for_project(project).count()


class TestBudgetIsolation(ProjectEndpointContract):
    basename = "project-budget"
    write_role = Role.ADMIN
    create_references_nothing = True

    def make_object(self, project):
        return billing.budget_create(project=project, name=f"b{next(_seq)}", amount=Decimal(100))

    def create_payload(self, project):
        return {"name": f"b{next(_seq)}", "amount": "250.5", "thresholds": [25, 100]}

    def update_payload(self, obj):
        return {"amount": "300", "policy": "stop_spot"}

    def count(self, project):
        return Budget.objects.for_project(project).count()


class TestPointsIsolation(ProjectEndpointContract):
    basename = "project-pointsentry"
    actions = ("list", "retrieve")

    def make_object(self, project):
        return billing.points_credit(project=project, amount=Decimal(10))

    def count(self, project):
        return PointsEntry.objects.for_project(project).count()


class TestForecastIsolation(ProjectEndpointContract):
    basename = "project-forecast"
    singleton = True
    actions = ("list",)


# --- project endpoints ----------------------------------------------------------------------


def url(name, project, **kwargs):
    return reverse(f"api:project-{name}", kwargs={"project_slug": project.slug, **kwargs})


def test_invoice_downloads_are_the_stored_bytes_and_verify_recomputes(
    client_for, project, other_project
):
    invoice = issued(project)
    client = client_for(project.owner)
    response = client.get(url("invoice-download-json", project, pk=invoice.pk))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.content == invoice.document.encode()
    assert 'filename="kumo-invoice-' in response["Content-Disposition"]
    assert response["X-Content-SHA256"] == invoice.content_hash
    response = client.get(url("invoice-download-csv", project, pk=invoice.pk))
    assert response["Content-Type"].startswith("text/csv")
    assert response.content.decode() == billing.invoice_csv(invoice.document)
    check = client.get(url("invoice-verify", project, pk=invoice.pk)).json()
    assert check == {
        "stored_hash": invoice.content_hash,
        "recomputed_hash": invoice.content_hash,
        "identical": True,
    }
    # another project's invoice is missing, for downloads too
    theirs = issued(other_project)
    for name in ("invoice-download-json", "invoice-download-csv", "invoice-verify"):
        assert client.get(url(name, project, pk=theirs.pk)).status_code == 404


def test_the_invoice_lists_totals_and_a_reader_may_read_it(client_for, project, users_by_role):
    invoice = issued(project)
    body = client_for(users_by_role[Role.READER]).get(url("invoice-list", project)).json()
    [item] = body["results"]
    assert item["total"] == "100.000000" and item["content_hash"] == invoice.content_hash
    assert json.loads(invoice.document)["total"] == "100.00"


def test_forecast_answers_so_far_and_projected(client_for, project):
    billing.rate_card_create(valid_from=datetime(2025, 1, 1, tzinfo=UTC), prices=PRICES)
    # Opened an hour ago, or at the month's start if that is later: "so far" counts now's month
    # alone, and a run in a month's first hour would otherwise count less than an hour.
    now = datetime.now(UTC)
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    opened = max(now - timedelta(hours=1), month)
    usage.usage_open(Subject(project, "open"), "vcpu", 1, opened)
    billing.budget_create(project=project, name="m", amount=Decimal(1_000_000))
    body = client_for(project.owner).get(url("forecast-list", project)).json()
    hours = Decimal((now - opened).total_seconds()) / 3600  # up to the request, at least these
    assert Decimal(body["so_far"]) >= (10 * hours).quantize(Decimal("0.01"), rounding=ROUND_DOWN)
    assert Decimal(body["projected"]) >= Decimal(body["so_far"])
    assert body["budgets"][0]["name"] == "m" and body["currency"] == "JPY"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"name": "b", "amount": "0"}, "amount"),
        ({"name": "b", "amount": "-3"}, "amount"),
        ({"name": "b", "amount": "10", "thresholds": [50, 50]}, "thresholds"),
        ({"name": "b", "amount": "10", "thresholds": [0]}, "thresholds"),
        ({"name": "b", "amount": "10", "policy": "explode"}, "policy"),
        ({"amount": "10"}, "name"),
    ],
)
def test_bad_budgets_answer_400_naming_the_field(client_for, project, payload, field):
    response = client_for(project.owner).post(url("budget-list", project), payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["details"]
    assert Budget.objects.count() == 0


def test_a_budget_name_is_unique_in_its_project(client_for, project):
    client = client_for(project.owner)
    assert client.post(url("budget-list", project), {"name": "b", "amount": "5"}).status_code == 201
    response = client.post(url("budget-list", project), {"name": "b", "amount": "5"})
    assert response.status_code == 409 and "name" in response.json()["details"]


# --- operators ------------------------------------------------------------------------------


def test_operators_create_rate_cards_and_each_starts_where_the_last_ends(client_for, staff):
    client = client_for(staff)
    payload = {"valid_from": "2026-01-01T00:00:00Z", "prices": PRICES, "spot_factor": "0.25"}
    response = client.post(reverse("api:admin-ratecard-list"), payload, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["version"] == 1 and response.json()["spot_factor"] == "0.2500"
    first_id = response.json()["id"]
    response = client.post(
        reverse("api:admin-ratecard-list"),
        {**payload, "valid_from": "2026-02-01T00:00:00Z"},
        format="json",
    )
    assert response.status_code == 201
    first = client.get(reverse("api:admin-ratecard-detail", kwargs={"pk": first_id})).json()
    versions = client.get(reverse("api:admin-ratecard-list")).json()["results"]
    assert [v["version"] for v in versions] == [2, 1]
    assert versions[1]["valid_until"] == versions[0]["valid_from"]
    assert first["version"] == 1 and len(first["prices"]) == len(PRICES)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"valid_from": "2026-01-01T00:00:00Z", "prices": PRICES[:3]}, "prices"),
        ({"valid_from": "yesterday", "prices": PRICES}, "valid_from"),
        (
            {"valid_from": "2026-01-01T00:00:00Z", "prices": PRICES, "spot_factor": "11"},
            "spot_factor",
        ),
        ({"prices": PRICES}, "valid_from"),
    ],
)
def test_bad_rate_cards_answer_400_naming_the_field(client_for, staff, payload, field):
    response = client_for(staff).post(reverse("api:admin-ratecard-list"), payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["details"]


def test_members_cannot_reach_operator_billing(client_for, project):
    client = client_for(project.owner)
    for name in ("admin-ratecard-list", "admin-invoice-list", "admin-pointsentry-list"):
        assert client.get(reverse(f"api:{name}")).status_code == 403


def test_operators_issue_a_month_once(client_for, staff, project):
    billing.rate_card_create(valid_from=datetime(2025, 1, 1, tzinfo=UTC), prices=PRICES)
    used(project, start=datetime(2025, 3, 1, tzinfo=UTC))
    client = client_for(staff)
    issue = reverse("api:admin-invoice-issue")
    response = client.post(issue, {"period": "2025-03"}, format="json")
    assert response.status_code == 201
    assert [i["project"] for i in response.json()] == [project.slug]
    assert client.post(issue, {"period": "2025-03"}, format="json").json() == []
    listed = client.get(reverse("api:admin-invoice-list"), {"project": project.slug}).json()
    assert listed["count"] == 1


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"period": "2025-13"}, "period"),
        ({"period": "2999-01"}, "period"),
        ({"period": "2025-03", "project": "no-such-project"}, "project"),
    ],
)
def test_bad_issues_answer_400_naming_the_field(client_for, staff, payload, field):
    billing.rate_card_create(valid_from=datetime(2025, 1, 1, tzinfo=UTC), prices=PRICES)
    response = client_for(staff).post(reverse("api:admin-invoice-issue"), payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["details"]


def test_operators_credit_points_and_the_project_reads_its_ledger(client_for, staff, project):
    response = client_for(staff).post(
        reverse("api:admin-pointsentry-list"),
        {"project": project.slug, "amount": "500", "note": "FY2026"},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["balance_after"] == "500.000000"
    ledger = client_for(project.owner).get(url("pointsentry-list", project)).json()["results"]
    assert [(e["kind"], e["amount"]) for e in ledger] == [("credit", "500.000000")]
    response = client_for(staff).post(
        reverse("api:admin-pointsentry-list"),
        {"project": project.slug, "amount": "-600", "kind": "adjustment"},
        format="json",
    )
    assert response.status_code == 409
    response = client_for(staff).post(
        reverse("api:admin-pointsentry-list"), {"project": "nope", "amount": "5"}, format="json"
    )
    assert response.status_code == 400 and "project" in response.json()["details"]
