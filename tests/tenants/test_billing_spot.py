"""End to end through the spot services: an on-demand request evicts spot VMs; each victim's
bill runs through its notice and stops at its eviction time, at the spot factor, and the
on-demand VM's bill starts when it is placed in the room they free."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from compute import services
from compute.choices import VmState
from compute.models import VirtualMachine
from tenants import billing
from tenants.models import UsageRecord
from tests.compute.test_spot import _on_demand, _stop_reported, roomy, world  # noqa: F401
from tests.compute.test_vms import fresh, sent  # noqa: F401

pytestmark = pytest.mark.django_db


def test_an_evicted_spot_vms_bill_stops_at_the_eviction(world, sent):  # noqa: F811
    billing.rate_card_create(
        valid_from=datetime(2025, 1, 1, tzinfo=UTC),
        prices=[
            {"resource": r, "unit_price": "1"} for r in ("vcpu", "memory", "storage", "global_ip")
        ]
        + [{"resource": "gpu", "unit_price": "100"}],
        spot_factor=Decimal("0.25"),
    )
    waiter = _on_demand(world, world["t8"])
    victims = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    assert victims and all(
        UsageRecord.objects.filter(subject_id=str(v.pk), ended_at__isnull=True).count() == 3
        for v in victims
    )  # the notice still bills
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    for victim in victims:
        _stop_reported(victim)
    for victim in victims:
        victim = fresh(victim)
        assert victim.state == VmState.EVICTED
        rows = UsageRecord.objects.filter(subject_id=str(victim.pk))
        assert {r.ended_at for r in rows} == {victim.evicted_at}
        assert {r.priority for r in rows} == {"spot"}
        gpu = rows.get(resource="gpu")
        assert gpu.model == "A100-SXM4-40GB" and gpu.quantity == 4
    waiter = fresh(waiter)
    assert waiter.state == VmState.PROVISIONING
    started = UsageRecord.objects.get(subject_id=str(waiter.pk), resource="gpu")
    assert started.ended_at is None and started.priority == "on_demand"
    assert started.started_at >= max(fresh(v).evicted_at for v in victims)

    # The victims' project's spend: exactly its GPU-seconds up to the eviction at 100 x 0.25
    project = victims[0].project
    now = timezone.now()
    start, end = billing.month_bounds(now.date())
    spent = billing.spend([project.pk], start, end, open_until=now)[project.pk]
    expected = Decimal(0)
    for row in UsageRecord.objects.filter(project=project, resource="gpu"):
        seconds = Decimal(((row.ended_at or now) - max(row.started_at, start)).total_seconds())
        expected += row.quantity * seconds / 3600 * 100 * Decimal("0.25")
    cpu_mem = Decimal(0)
    for row in UsageRecord.objects.filter(project=project).exclude(resource="gpu"):
        seconds = Decimal(((row.ended_at or now) - max(row.started_at, start)).total_seconds())
        cpu_mem += row.quantity * seconds / 3600 * Decimal("0.25")
    assert abs(spent - (expected + cpu_mem)) <= Decimal("0.05")  # lines rounded to 0.01
