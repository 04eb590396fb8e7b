"""Rating, invoices, rate cards, budgets and points in the services.

Invoices are checked against amounts worked out by hand, against the Python reference of
the SQL aggregate on random intervals (hypothesis), and recomputed byte for byte."""

import threading
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from django.core import mail
from django.db import IntegrityError, connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compute.choices import Priority, VmState
from controlplane.errors import Conflict, InvalidInput
from controlplane.models import AuditEvent, Event
from tenants import billing, usage
from tenants import services as tenants
from tenants.choices import PointsKind
from tenants.models import Budget, BudgetAlert, Invoice, PointsEntry, RateCard, UsageRecord
from tests.conftest import POSTGRES
from tests.factories import make_host, make_project, make_template, make_vm

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PRICES = [
    {"resource": "vcpu", "unit_price": "10"},
    {"resource": "memory", "unit_price": "1.5"},
    {"resource": "gpu", "unit_price": "300"},
    {"resource": "gpu", "model": "A100-SXM4-40GB", "unit_price": "500"},
    {"resource": "storage", "unit_price": "7.3"},
    {"resource": "global_ip", "unit_price": "2"},
]


def card(valid_from=T0, prices=PRICES, **fields):
    return billing.rate_card_create(valid_from=valid_from, prices=prices, **fields)


class Subject:
    """Something billable of ``project`` (storage will pass its volumes)."""

    class _meta:
        label_lower = "tests.subject"

    def __init__(self, project, pk):
        self.project_id, self.pk = project.pk, pk

    def __str__(self):
        return f"subject {self.pk}"


def interval(project, resource, quantity, start, end, *, pk=None, model="", priority="on_demand"):
    subject = Subject(project, pk or f"{resource}-{start.isoformat()}")
    usage.usage_open(subject, resource, quantity, start, model=model, priority=priority)
    if end is not None:
        usage.usage_close(subject, resource, at=end, model=model)


def lines(invoice):
    import json

    return json.loads(invoice.document)["lines"]


# --- rate cards -----------------------------------------------------------------------------


def test_versions_chain_without_gap_or_overlap():
    v1 = card()
    v2 = card(T0 + timedelta(days=40))
    v1.refresh_from_db()
    assert (v1.version, v2.version) == (1, 2)
    assert v1.valid_until == v2.valid_from and v2.valid_until is None
    assert billing.rate_card_at(T0 + timedelta(days=39)) == v1
    assert billing.rate_card_at(T0 + timedelta(days=40)) == v2
    assert billing.rate_card_at(T0 - timedelta(seconds=1)) is None


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"prices": PRICES[:2]}, "prices"),
        ({"prices": [*PRICES, {"resource": "vcpu", "unit_price": "1"}]}, "prices"),
        ({"prices": [*PRICES, {"resource": "disk", "unit_price": "1"}]}, "prices"),
        ({"prices": [{**PRICES[0], "unit_price": "-1"}, *PRICES[1:]]}, "prices"),
        ({"prices": [*PRICES, {"resource": "vcpu", "model": "x", "unit_price": "1"}]}, "prices"),
        ({"spot_factor": Decimal("-0.1")}, "spot_factor"),
        ({"valid_from": datetime(2026, 1, 1)}, "valid_from"),
    ],
)
def test_bad_rate_cards_name_the_field(fields, field):
    with pytest.raises(InvalidInput) as e:
        card(**fields)
    assert field in e.value.details


def test_a_version_must_start_after_the_last_and_after_invoiced_months(project):
    card()
    with pytest.raises(InvalidInput) as e:
        card(T0)
    assert "valid_from" in e.value.details
    interval(project, "vcpu", 1, T0, T0 + timedelta(hours=1))
    billing.invoices_issue(period=date(2026, 1, 1), now=T0 + timedelta(days=40))
    with pytest.raises(InvalidInput, match="invoiced"):
        card(T0 + timedelta(days=20))
    card(datetime(2026, 2, 1, tzinfo=UTC))


@pytest.mark.skipif(not POSTGRES, reason="the exclusion constraint is PostgreSQL's")
def test_the_database_refuses_overlapping_versions():
    v1 = card()
    RateCard.objects.filter(pk=v1.pk).update(valid_until=T0 + timedelta(days=10))
    with pytest.raises(IntegrityError), transaction.atomic():
        RateCard.objects.create(
            version=9, valid_from=T0 + timedelta(days=5), spot_factor=1, reserved_factor=1
        )


@pytest.mark.postgres  # an exclusion constraint: PostgreSQL only
def test_the_database_refuses_two_open_versions():
    card()
    with pytest.raises(IntegrityError), transaction.atomic():
        RateCard.objects.create(
            version=9, valid_from=T0 + timedelta(days=500), spot_factor=1, reserved_factor=1
        )


# --- invoices -------------------------------------------------------------------------------


def test_an_invoice_clips_to_the_month_splits_at_a_price_change_and_rounds_per_line(project):
    card(spot_factor=Decimal("0.3"))
    card(
        datetime(2026, 1, 16, tzinfo=UTC),
        prices=[{**p, "unit_price": str(Decimal(p["unit_price"]) * 2)} for p in PRICES],
    )
    # 4 vCPUs from Dec 31 12:00 to Jan 20 00:00: 15 days at 10, 4 days at 20 (Jan 1-16-20)
    interval(project, "vcpu", 4, datetime(2025, 12, 31, 12, tzinfo=UTC), T0 + timedelta(days=19))
    # one spot A100 for 1 h 20 min 0.5 s, open past the month's end on the second card
    interval(
        project,
        "gpu",
        1,
        datetime(2026, 1, 31, 22, 39, 59, 500000, tzinfo=UTC),
        None,
        model="A100-SXM4-40GB",
        priority="spot",
    )
    interval(project, "storage", 100, T0, None)  # 100 GiB all month
    [invoice] = billing.invoices_issue(
        period=date(2026, 1, 1), now=datetime(2026, 2, 2, tzinfo=UTC)
    )
    got = {(li["resource"], li["rate_card"]): li for li in lines(invoice)}
    assert got[("vcpu", 1)]["quantity"] == "1440.000000"  # 4 x 15 d x 24 h
    assert got[("vcpu", 1)]["amount"] == "14400.00"
    assert got[("vcpu", 2)]["amount"] == str(Decimal(4 * 4 * 24 * 20)) + ".00"
    gpu = got[("gpu", 2)]
    # 1 h 20 min 0.5 s = 4800.5 s at 1000 x 0.3 per hour = 400.041666… -> 400.04
    assert (gpu["priority"], gpu["unit_price"], gpu["factor"]) == ("spot", "1000.000000", "0.3000")
    assert gpu["amount"] == "400.04" and gpu["quantity"] == "1.333472"
    # storage: 100 GiB x 744 h / 730 h per GiB-month, at 7.3 then 14.6
    storage = got[("storage", 1)]["amount"], got[("storage", 2)]["amount"]
    assert storage == ("360.00", "768.00")  # 100 x 360/730 x 7.3 ; 100 x 384/730 x 14.6
    assert invoice.total == sum(Decimal(li["amount"]) for li in lines(invoice))
    assert invoice.amount_due == invoice.total and invoice.content_hash == billing.content_hash(
        invoice.document
    )
    assert AuditEvent.objects.filter(action="invoice.issue", object_id=str(invoice.pk)).exists()


def test_issuing_twice_changes_nothing_and_an_unfinished_month_is_refused(project):
    card()
    interval(project, "vcpu", 1, T0, T0 + timedelta(hours=3))
    first = billing.invoices_issue(period=date(2026, 1, 1), now=datetime(2026, 3, 1, tzinfo=UTC))
    again = billing.invoices_issue(period=date(2026, 1, 1), now=datetime(2026, 3, 1, tzinfo=UTC))
    assert len(first) == 1 and again == []
    with pytest.raises(InvalidInput) as e:
        billing.invoices_issue(period=date(2026, 2, 1), now=datetime(2026, 2, 20, tzinfo=UTC))
    assert "period" in e.value.details


def test_a_month_without_a_rate_card_cannot_be_invoiced(project):
    card(datetime(2026, 1, 10, tzinfo=UTC))
    interval(project, "vcpu", 1, T0 + timedelta(days=12), T0 + timedelta(days=13))
    with pytest.raises(Conflict) as e:
        billing.invoices_issue(period=date(2026, 1, 1), now=datetime(2026, 3, 1, tzinfo=UTC))
    assert e.value.code == "no_rate_card"


def test_recompute_is_byte_identical_and_a_changed_history_shows(project):
    card()
    interval(project, "memory", Decimal("1.46484375"), T0, T0 + timedelta(hours=5))
    [invoice] = billing.invoices_issue(
        period=date(2026, 1, 1), now=datetime(2026, 3, 1, tzinfo=UTC)
    )
    assert billing.invoice_verify(invoice)["identical"]
    assert billing.invoice_csv(invoice.document) == billing.invoice_csv(
        billing.invoice_compute(project, date(2026, 1, 1))[0]
    )
    UsageRecord.objects.update(ended_at=T0 + timedelta(hours=6))
    check = billing.invoice_verify(invoice)
    assert not check["identical"] and check["stored_hash"] == invoice.content_hash


def test_the_csv_has_a_header_the_lines_and_the_total(project):
    card()
    interval(project, "global_ip", 1, T0, T0 + timedelta(hours=10))
    [invoice] = billing.invoices_issue(
        period=date(2026, 1, 1), now=datetime(2026, 3, 1, tzinfo=UTC)
    )
    rows = billing.invoice_csv(invoice.document).splitlines()
    assert rows[1] == ",".join(billing.CSV_COLUMNS)
    assert rows[2] == "global_ip,,on_demand,1,IP-hour,10.000000,2.000000,1.0000,20.00"
    assert rows[-1] == "total,,,,JPY,,,,20.00"


@st.composite
def histories(draw):
    """Random intervals in and around January 2026 and 1-3 rate card versions."""
    month = 31 * 86_400 * 10**6
    cuts = sorted(draw(st.sets(st.integers(1, month - 1), max_size=2)))
    items = []
    for _ in range(draw(st.integers(1, 12))):
        start = draw(st.integers(-month // 4, month + month // 4))
        length = draw(st.one_of(st.none(), st.integers(0, month)))
        items.append(
            (
                draw(st.sampled_from(["vcpu", "memory", "gpu", "storage", "global_ip"])),
                draw(st.sampled_from(["on_demand", "spot", "reserved"])),
                draw(st.decimals(min_value=Decimal("0.0009765625"), max_value=2048, places=10)),
                start,
                length,
            )
        )
    return cuts, items


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(history=histories())
def test_random_histories_rate_exactly_and_recompute_byte_for_byte(history):
    """Every line's amount is the exact rational amount rounded half-even; the SQL aggregate
    agrees with the Python reference; recomputing gives identical JSON and CSV bytes."""
    cuts, items = history
    project = make_project()
    RateCard.objects.all().delete()
    Invoice.objects.all().delete()
    start = datetime(2025, 12, 1, tzinfo=UTC)
    versions = [card(start, spot_factor=Decimal("0.35"), reserved_factor=Decimal("0.6"))]
    for n, cut in enumerate(cuts, start=2):
        prices = [{**p, "unit_price": str(Decimal(p["unit_price"]) * n)} for p in PRICES]
        versions.append(card(T0 + timedelta(microseconds=cut), prices=prices))
    for n, (resource, priority, quantity, offset, length) in enumerate(items):
        begin = T0 + timedelta(microseconds=offset)
        end = None if length is None else begin + timedelta(microseconds=length)
        model = "A100-SXM4-40GB" if resource == "gpu" and n % 2 else ""
        interval(
            project, resource, quantity, begin, end, pk=f"s{n}", model=model, priority=priority
        )

    period = date(2026, 1, 1)
    document, total = billing.invoice_compute(project, period)
    assert billing.invoice_compute(project, period) == (document, total)
    month_start, month_end = billing.month_bounds(period)
    python = billing.usage_seconds(month_start, month_end, project_ids=[project.pk], in_python=True)
    sql = billing.usage_seconds(month_start, month_end, project_ids=[project.pk])
    assert python == sql

    # the exact amounts, with fractions, from the rows and the cards
    for version in versions:
        version.refresh_from_db()
    expected: dict = {}
    for r in UsageRecord.objects.filter(project=project):
        s, e = max(r.started_at, month_start), min(r.ended_at or month_end, month_end)
        for v in versions:
            cs, ce = max(s, v.valid_from), min(e, v.valid_until or month_end)
            if ce <= cs:
                continue
            price = {(p.resource, p.model): p.unit_price for p in v.prices.all()}
            unit = price.get((r.resource, r.model), price.get((r.resource, "")))
            hours = Fraction((ce - cs) // timedelta(microseconds=1), 3600 * 10**6)
            if r.resource == "storage":
                hours /= 730
            key = (r.resource, r.model, r.priority, v.version)
            amount = Fraction(r.quantity) * hours * Fraction(unit) * Fraction(v.factor(r.priority))
            expected[key] = expected.get(key, 0) + amount
    import json

    doc = json.loads(document)
    got = {
        (li["resource"], li["model"], li["priority"], li["rate_card"]): li for li in doc["lines"]
    }
    assert set(got) == set(expected)
    for key, exact in expected.items():
        rounded = Decimal(exact.numerator) / Decimal(exact.denominator)
        assert Decimal(got[key]["amount"]) == billing._quantize(rounded, Decimal("0.01")), key
    assert Decimal(doc["total"]) == total == sum(Decimal(li["amount"]) for li in doc["lines"])


# --- forecast -------------------------------------------------------------------------------


def test_forecast_extends_open_intervals_to_the_month_end(project):
    card()
    now = datetime(2026, 1, 11, tzinfo=UTC)
    interval(project, "vcpu", 1, T0, None)  # open since Jan 1: 10 days so far, 31 in all
    interval(project, "vcpu", 2, T0, T0 + timedelta(days=1), pk="closed")
    result = billing.forecast(project, now=now)
    assert result["so_far"] == Decimal(10 * 24 * 10 + 2 * 24 * 10)
    assert result["projected"] == Decimal(31 * 24 * 10 + 2 * 24 * 10)


# --- budgets --------------------------------------------------------------------------------


@pytest.fixture
def spending(project):
    """A project spending 10 an hour on one open vCPU since Jan 1."""
    card()
    interval(project, "vcpu", 1, T0, None)
    return project


def at_hours(hours):
    return T0 + timedelta(hours=hours)


def test_each_threshold_alerts_once_by_event_and_mail(spending, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    budget = billing.budget_create(project=spending, name="monthly", amount=Decimal(1000))
    assert billing.budgets_check(now=at_hours(40))["alerts"] == []  # 400: 40 %
    assert billing.budgets_check(now=at_hours(85))["alerts"] == [(budget.pk, 50), (budget.pk, 80)]
    assert billing.budgets_check(now=at_hours(90))["alerts"] == []
    assert billing.budgets_check(now=at_hours(100))["alerts"] == [(budget.pk, 100)]
    assert billing.budgets_check(now=at_hours(200))["alerts"] == []
    events = Event.objects.filter(kind="budget.threshold").order_by("pk")
    assert [e.payload["threshold"] for e in events] == [50, 80, 100]
    assert events[0].payload["spent"] == "850.00"
    assert BudgetAlert.objects.count() == 3
    # next month, again once each
    later = datetime(2026, 2, 28, tzinfo=UTC)
    assert len(billing.budgets_check(now=later)["alerts"]) == 3


def test_mail_goes_to_the_admins_after_commit(
    spending, settings, django_capture_on_commit_callbacks
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    billing.budget_create(project=spending, name="m", amount=Decimal(100), thresholds=[50])
    with django_capture_on_commit_callbacks(execute=True):
        billing.budgets_check(now=at_hours(6))
    assert len(mail.outbox) == 1 and "budget.threshold" in mail.outbox[0].subject


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    thresholds=st.lists(st.integers(1, 300), min_size=1, max_size=6, unique=True),
    checks=st.lists(st.integers(0, 31 * 24 - 1), min_size=1, max_size=12),
)
def test_any_thresholds_and_checks_alert_exactly_once_each(thresholds, checks):
    project = make_project()
    RateCard.objects.all().delete()
    Invoice.objects.all().delete()
    Budget.objects.all().delete()
    card()
    interval(project, "vcpu", 1, T0, None, pk=f"cpu-{project.pk}")
    budget = billing.budget_create(
        project=project, name="b", amount=Decimal(1000), thresholds=thresholds
    )
    alerted = []
    for hours in sorted(checks):
        alerted += [
            t for b, t in billing.budgets_check(now=at_hours(hours))["alerts"] if b == budget.pk
        ]
    spent = Decimal(max(checks) * 10)
    assert sorted(alerted) == sorted(t for t in thresholds if spent * 100 >= 1000 * t)
    assert Event.objects.filter(kind="budget.threshold", project=project).count() == len(alerted)


@pytest.mark.skipif(not POSTGRES, reason="concurrent transactions need PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_concurrent_checks_alert_once(spending):
    billing.budget_create(project=spending, name="b", amount=Decimal(100), thresholds=[50, 100])
    barrier = threading.Barrier(4)
    errors = []

    def check():
        try:
            barrier.wait()
            billing.budgets_check(now=at_hours(50))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Event.objects.filter(kind="budget.threshold").count() == 2
    assert BudgetAlert.objects.count() == 2


def test_bad_budgets_name_the_field(project):
    for fields, field in [
        ({"amount": Decimal(0)}, "amount"),
        ({"thresholds": [50, 50]}, "thresholds"),
        ({"thresholds": [0]}, "thresholds"),
        ({"thresholds": []}, "thresholds"),
        ({"policy": "shoot"}, "policy"),
    ]:
        with pytest.raises(InvalidInput) as e:
            billing.budget_create(project=project, name="b", **{"amount": Decimal(5), **fields})
        assert field in e.value.details


# --- over budget ----------------------------------------------------------------------------


@pytest.fixture
def vms(project, monkeypatch):
    from controlplane.celery import app

    monkeypatch.setattr(app, "send_task", lambda *a, **k: None)
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    make_host()
    from compute.models import VirtualMachine

    made = {}
    for name, priority in [("spot-a", Priority.SPOT), ("od-a", Priority.ON_DEMAND)]:
        vm = make_vm(project, name=name, template=make_template(gpus=1), priority=priority)
        VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
        made[name] = vm
    return made


@pytest.mark.parametrize(
    ("policy", "stopped"),
    [("notify", set()), ("stop_spot", {"spot-a"}), ("stop_all", {"spot-a", "od-a"})],
)
def test_over_budget_stops_spot_first_then_the_rest_as_the_policy_says(
    project, vms, policy, stopped
):
    from compute.models import VirtualMachine

    card(datetime(2025, 1, 1, tzinfo=UTC))
    billing.budget_create(project=project, name="b", amount=Decimal("0.01"), policy=policy)
    done = billing.budgets_check(now=datetime.now(UTC) + timedelta(hours=1))
    names = set(
        VirtualMachine.objects.filter(pk__in=done["stopped"]).values_list("name", flat=True)
    )
    assert names == stopped
    stopping = set(  # shelved, so that their GPUs really return
        VirtualMachine.objects.filter(state="shelving").values_list("name", flat=True)
    )
    assert stopping == stopped
    steps = list(Event.objects.filter(kind="budget.reclaim").order_by("pk"))
    assert [e.payload["step"] for e in steps] == (
        [] if policy == "notify" else ["spot"] if policy == "stop_spot" else ["spot", "on_demand"]
    )
    # each step is announced (and audited) before its VMs are stopped
    for step in steps:
        first_stop = AuditEvent.objects.filter(
            action="vm.shelve", object_id__in=[str(vms[n].pk) for n in step.payload["vms"]]
        ).order_by("pk")[0]
        announced = AuditEvent.objects.get(
            action="budget.reclaim", detail__step=step.payload["step"]
        )
        assert announced.pk < first_stop.pk
    assert billing.budgets_check(now=datetime.now(UTC) + timedelta(hours=1))["stopped"] == []


# --- points ---------------------------------------------------------------------------------


def test_points_pay_invoices_through_a_ledger(project):
    card()
    interval(project, "vcpu", 1, T0, T0 + timedelta(hours=10))  # 100
    billing.points_credit(project=project, amount=Decimal(60), note="bought")
    [invoice] = billing.invoices_issue(
        period=date(2026, 1, 1), now=datetime(2026, 3, 1, tzinfo=UTC)
    )
    assert (invoice.total, invoice.points_applied, invoice.amount_due) == (100, 60, 40)
    entries = list(PointsEntry.objects.for_project(project).order_by("id"))
    assert [(e.kind, e.amount, e.balance_after) for e in entries] == [
        (PointsKind.CREDIT, 60, 60),
        (PointsKind.DEBIT, -60, 0),
    ]
    assert entries[1].invoice == invoice
    assert billing.points_balance(project) == 0
    assert billing.invoice_verify(invoice)["identical"]  # points are beside the document


def test_points_never_go_below_zero(project):
    billing.points_credit(project=project, amount=Decimal(5))
    with pytest.raises(Conflict) as e:
        billing.points_credit(project=project, amount=Decimal(-6), kind=PointsKind.ADJUSTMENT)
    assert e.value.code == "insufficient_points"
    with pytest.raises(InvalidInput) as e:
        billing.points_credit(project=project, amount=Decimal(-1))
    assert "amount" in e.value.details
    billing.points_credit(project=project, amount=Decimal(-5), kind=PointsKind.ADJUSTMENT)
    assert billing.points_balance(project) == 0


# --- beat -----------------------------------------------------------------------------------


def test_the_beat_tasks_check_budgets_and_issue_last_month(spending, monkeypatch):
    from tenants import tasks

    billing.budget_create(project=spending, name="b", amount=Decimal(1))
    assert tasks.budgets_check()["alerts"] == 3  # a month and more of 10 an hour
    assert AuditEvent.objects.filter(action="budget.threshold", source="controller").count() == 3
    assert tasks.invoices_issue() == 1  # last month, the open vCPU interval until its end
    assert tasks.invoices_issue() == 0  # issued already
    assert Invoice.objects.get(project=spending).period_end == billing.month_start(
        datetime.now(UTC).date()
    )


def test_the_invoice_task_waits_while_no_rate_card_covers_the_month(project):
    from tenants import tasks

    assert tasks.invoices_issue() == 0
    assert Invoice.objects.count() == 0
