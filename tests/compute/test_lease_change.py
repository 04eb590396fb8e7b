"""A lease changed. Its start moved, before it holds GPUs: admitted again over the new
period with itself set aside, its waiting VMs waiting on. Its end moved: later is admitted
again for the time it adds (refused with the latest end that fits, under concurrency on
PostgreSQL too), its GPUs and its bill follow it, and its project is told again before the
new end; earlier gives the time back. Its size: more is admitted over what is left of it
(refused with the most that fits) and held at once, the spot VMs on the GPUs taken noticed;
fewer lets go of GPUs its VMs do not use. Its bill follows from the change."""

from contextlib import contextmanager
from unittest import mock

import pytest
from django.utils import timezone

from compute import services
from compute.choices import LeaseState, Priority, VmState
from compute.models import Device, Lease, LeaseAllocation
from controlplane.errors import Conflict, InvalidInput
from controlplane.models import AuditEvent, Event
from tenants.models import UsageRecord
from tests.compute.test_guarantees import _race, roomy_project
from tests.compute.test_leases import LEAD, _one_now, hour, reserve  # noqa: F401 (_one_now: autouse)
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_template, make_vm


def end(lease, at):
    return services.lease_update(lease=lease, ends_at=at)


@contextmanager
def clock(at):
    """``timezone.now()`` answers ``at``: the test's leases start an hour from now."""
    with mock.patch("django.utils.timezone.now", return_value=at):
        yield


def started(lease):
    services.leases_tick(now=lease.starts_at - LEAD)
    services.leases_tick(now=lease.starts_at)
    return Lease.objects.get(pk=lease.pk)


@pytest.mark.django_db
def test_an_active_lease_ends_later_holding_its_gpus_and_billed_to_the_new_end(sent):
    make_host("gpu-a")  # 8 GPUs
    mine, other = roomy_project(), roomy_project()
    lease = reserve(mine, 4, hour(1), hour(3))
    services.leases_tick(now=hour(1) - LEAD)
    services.leases_tick(now=hour(1))
    held = set(Device.objects.filter(lease=lease).values_list("pk", flat=True))
    assert len(held) == 4

    lease = end(lease, hour(5))
    assert (lease.ends_at, lease.state) == (hour(5), LeaseState.ACTIVE)
    assert Lease.objects.get(pk=lease.pk).ends_at == hour(5)
    spans = set(LeaseAllocation.objects.filter(lease=lease).values_list("starts_at", "ends_at"))
    assert spans == {(hour(1), hour(5))}
    audit = AuditEvent.objects.get(action="lease.update", object_id=str(lease.pk))
    five, three = hour(5).isoformat(), hour(3).isoformat()
    assert audit.detail == {"ends_at": five, "previous_ends_at": three}
    told = Event.objects.get(kind="lease.updated", project=mine)
    assert told.payload == {"lease": lease.pk, "ends_at": five, "was": three}

    # The time it added is taken: another project's 8 GPUs fit only after the new end.
    with pytest.raises(Conflict) as refused:
        reserve(other, 8, hour(4), hour(6), name="after")
    assert refused.value.details["earliest_starts_at"] == [hour(5).isoformat()]
    # Its project is told before the new end, not the old one; it ends then, and so does its bill.
    assert services.leases_tick(now=hour(3) - LEAD)["warned"] == 0
    assert services.leases_tick(now=hour(5) - LEAD)["warned"] == 1
    assert services.leases_tick(now=hour(3))["ended"] == 0
    assert set(Device.objects.filter(lease=lease).values_list("pk", flat=True)) == held
    assert services.leases_tick(now=hour(5))["ended"] == 1
    bill = UsageRecord.objects.get(subject_type="compute.lease", subject_id=str(lease.pk))
    assert (bill.started_at, bill.ended_at) == (hour(1), hour(5))


@pytest.mark.django_db
def test_an_end_later_that_does_not_fit_names_the_latest_end_that_does(sent):
    make_host("gpu-a")
    mine, other = roomy_project(), roomy_project()
    lease = reserve(mine, 6, hour(1), hour(3))
    reserve(other, 4, hour(5), hour(7), name="next")
    with pytest.raises(Conflict) as refused:
        end(lease, hour(6))
    assert refused.value.code == "no_capacity"
    assert refused.value.details["latest_ends_at"] == [hour(5).isoformat()]
    assert refused.value.details["ends_at"] == ["more than the fleet can reserve then (4 free)"]
    assert f"the latest end that fits is {hour(5).isoformat()}" in refused.value.message
    assert Lease.objects.get(pk=lease.pk).ends_at == hour(3)  # refused, unchanged
    assert not AuditEvent.objects.filter(action="lease.update").exists()
    # Up to the next lease's start it fits: back to back is no overlap.
    assert end(lease, hour(5)).ends_at == hour(5)
    # Now the next lease starts at its end: no later end fits at all.
    with pytest.raises(Conflict) as refused:
        end(lease, hour(6))
    assert "latest_ends_at" not in refused.value.details
    assert f"it cannot end later than {hour(5).isoformat()} now" in refused.value.message


@pytest.mark.django_db
def test_an_earlier_end_gives_the_time_back_and_tells_the_project_again(sent):
    make_host("gpu-a")
    mine, other = roomy_project(), roomy_project()
    lease = reserve(mine, 8, hour(1), hour(5))
    services.leases_tick(now=hour(1) - LEAD)
    services.leases_tick(now=hour(1))
    assert services.leases_tick(now=hour(5) - LEAD)["warned"] == 1
    lease = end(lease, hour(2))
    assert set(LeaseAllocation.objects.filter(lease=lease).values_list("ends_at", flat=True)) == {
        hour(2)
    }
    assert reserve(other, 8, hour(2), hour(4), name="then").state == LeaseState.SCHEDULED
    # Warned of the old end, it is warned again of the new one.
    assert services.leases_tick(now=hour(2) - LEAD)["warned"] == 1
    assert Event.objects.filter(kind="lease.ending", project=mine).count() == 2
    assert services.leases_tick(now=hour(2))["ended"] == 1


@pytest.mark.django_db
def test_a_scheduled_lease_moves_its_end_and_the_same_end_changes_nothing():
    make_host("gpu-a")
    lease = reserve(roomy_project(), 8, hour(1), hour(2))
    assert end(lease, hour(4)).ends_at == hour(4)
    assert not LeaseAllocation.objects.exists()  # it holds no GPU before its lead
    end(lease, hour(4))
    assert AuditEvent.objects.filter(action="lease.update").count() == 1
    # Both changes at once, one record.
    services.lease_update(lease=lease, ends_at=hour(3), lend_idle=False)
    both = AuditEvent.objects.filter(action="lease.update").latest("pk").detail
    assert both["ends_at"] == hour(3).isoformat() and both["lend_idle"] is False


@pytest.mark.django_db
@pytest.mark.parametrize(
    "at, reason",
    [
        (lambda: timezone.now(), "must be in the future"),
        (lambda: hour(1), "must be after starts_at"),
        (lambda: hour(2) + timezone.timedelta(days=400), "days at most"),
    ],
)
def test_a_bad_end_names_the_field(at, reason):
    make_host("gpu-a")
    lease = reserve(roomy_project(), 8, hour(1), hour(2))
    with pytest.raises(InvalidInput) as bad:
        end(lease, at())
    assert reason in bad.value.details["ends_at"][0]


@pytest.mark.django_db
def test_an_ended_lease_keeps_its_end():
    make_host("gpu-a")
    lease = services.lease_cancel(lease=reserve(roomy_project(), 8, hour(1), hour(2)))
    with pytest.raises(Conflict) as ended:
        end(lease, hour(3))
    assert ended.value.code == "lease_ended"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change, promised", [("end", 6), ("gpus", 8)])
def test_a_change_and_new_leases_racing_for_the_same_gpus_never_both_win(change, promised):
    make_host("gpu-a")  # 8 GPUs
    projects = [roomy_project() for _ in range(4)]
    start, until = hour(2), hour(3)
    if change == "end":  # 6 GPUs, to end an hour later
        lease = reserve(projects[0], 6, hour(1), start, name="long")
        asked = {"ends_at": until}
    else:  # 2 GPUs, to hold all 8
        lease = reserve(projects[0], 2, start, until, name="long")
        asked = {"gpus": 8}

    def work(index):
        if index == 0:
            services.lease_update(lease=lease, **asked)
        else:
            reserve(projects[index], 6, start, until, name=f"new{index}")
        return "ok"

    results, errors = _race(4, work)
    assert errors == []
    assert results.count("ok") == 1 and results.count("no_capacity") == 3
    # Over [2 h, 3 h) the change or one new lease won, never both: the fleet holds it.
    overlapping = Lease.objects.filter(starts_at__lt=until, ends_at__gt=start)
    assert sum(overlapping.values_list("gpus", flat=True)) == promised


@pytest.mark.django_db
def test_an_active_lease_grows_at_once_noticing_spot_vms_and_billed_from_then(sent):
    make_host("gpu-a")
    make_host("gpu-b")  # 16 GPUs
    mine, other = roomy_project(), roomy_project()
    lease = started(reserve(mine, 4, hour(1), hour(5)))
    borrower = make_vm(other, template=make_template(gpus=8), priority=Priority.SPOT)
    report(fresh(borrower), "running")  # on the host the lease left whole

    with clock(hour(2)):
        lease = services.lease_update(lease=lease, gpus=12)
    assert (lease.gpus, lease.state, lease.state_reason) == (12, LeaseState.ACTIVE, "")
    assert Device.objects.filter(lease=lease).count() == 12
    spans = sorted(LeaseAllocation.objects.filter(lease=lease).values_list("starts_at", flat=True))
    assert spans == [hour(1)] * 4 + [hour(2)] * 8  # the added GPUs are held from the change
    assert fresh(borrower).state == VmState.EVICTING  # its full notice, as at a preparation
    bills = UsageRecord.objects.filter(subject_type="compute.lease", subject_id=str(lease.pk))
    assert sorted(bills.values_list("quantity", "started_at", "ended_at")) == [
        (4, hour(1), hour(2)),
        (12, hour(2), None),
    ]
    audit = AuditEvent.objects.get(action="lease.update", object_id=str(lease.pk))
    assert audit.detail == {"gpus": 12, "previous_gpus": 4, "spot_noticed": 1}
    assert Event.objects.get(kind="lease.updated").payload["gpus"] == 12


@pytest.mark.django_db
def test_a_growing_lease_takes_the_gpus_beside_those_it_holds(sent):
    """Its VMs need whole cells: the GPUs added come from the cell it holds, not from the
    host left whole that a new lease would take first."""
    a, b = make_host("gpu-a"), make_host("gpu-b")
    lease = started(reserve(roomy_project(), 2, hour(1), hour(5)))
    ((host, cell),) = set(Device.objects.filter(lease=lease).values_list("host_id", "numa_node"))
    assert host in (a.pk, b.pk)

    with clock(hour(2)):
        services.lease_update(lease=lease, gpus=4)

    held = Device.objects.filter(lease=lease)
    assert set(held.values_list("host_id", "numa_node")) == {(host, cell)}
    gpu4 = make_template(gpus=4)
    vm = make_vm(lease.project, template=gpu4, lease=Lease.objects.get(pk=lease.pk))
    assert fresh(vm).state == VmState.PROVISIONING  # four GPUs of one cell, in the lease
    assert set(Device.objects.filter(vm=vm).values_list("lease_id", flat=True)) == {lease.pk}


@pytest.mark.django_db
def test_more_gpus_than_fit_are_refused_with_the_most_that_do():
    make_host("gpu-a")  # 8 GPUs
    mine, other = roomy_project(), roomy_project()
    lease = reserve(mine, 4, hour(1), hour(3))
    reserve(other, 2, hour(2), hour(4), name="theirs")
    with pytest.raises(Conflict) as refused:
        services.lease_update(lease=lease, gpus=8)
    assert refused.value.code == "no_capacity"
    assert refused.value.details == {"gpus": ["more than the fleet can reserve then (at most 6)"]}
    assert Lease.objects.get(pk=lease.pk).gpus == 4
    assert services.lease_update(lease=lease, gpus=6).gpus == 6
    assert not LeaseAllocation.objects.exists()  # scheduled: it takes hold at its lead


@pytest.mark.django_db
def test_an_active_lease_shrinks_letting_go_of_gpus_its_vms_do_not_use(sent):
    make_host("gpu-a")  # 8 GPUs
    mine, other = roomy_project(), roomy_project()
    t2, t4 = make_template(gpus=2), make_template(gpus=4)
    lease = started(reserve(mine, 8, hour(1), hour(5)))
    workers = [make_vm(mine, template=t2, lease=lease) for _ in range(2)]
    assert {w.state for w in workers} == {VmState.PROVISIONING}
    with clock(hour(2)), pytest.raises(Conflict) as refused:
        services.lease_update(lease=lease, gpus=3)
    assert refused.value.code == "in_use" and refused.value.details == {"gpus": ["its VMs use 4"]}

    with clock(hour(2)):
        lease = services.lease_update(lease=lease, gpus=4)
    held = Device.objects.filter(lease=lease)
    assert held.count() == 4
    assert set(held.values_list("vm", flat=True)) == {w.pk for w in workers}
    cut = LeaseAllocation.objects.filter(lease=lease, ends_at=hour(2))
    assert cut.count() == 4  # the GPUs let go were its until the change
    bills = UsageRecord.objects.filter(subject_type="compute.lease", subject_id=str(lease.pk))
    assert sorted(bills.values_list("quantity", "ended_at")) == [(4, None), (8, hour(2))]
    # Another project's on-demand VM takes the GPUs given back.
    assert make_vm(other, template=t4).state == VmState.PROVISIONING
    # Its end moved later, the GPUs it let go of stay let go.
    with clock(hour(2)):
        end(lease, hour(6))
    spans = LeaseAllocation.objects.filter(lease=lease).values_list("ends_at", flat=True)
    assert sorted(spans) == [hour(2)] * 4 + [hour(6)] * 4


@pytest.mark.django_db
def test_a_bad_size_names_the_field():
    make_host("gpu-a")
    project = roomy_project()
    whole = services.lease_create(
        project=project, name="node", hosts=1, starts_at=hour(1), ends_at=hour(2)
    )
    with pytest.raises(InvalidInput) as bad:
        services.lease_update(lease=whole, gpus=4)
    assert "whole hosts" in bad.value.details["gpus"][0]
    services.lease_cancel(lease=whole)
    lease = reserve(project, 4, hour(1), hour(2))
    with pytest.raises(InvalidInput) as bad:
        services.lease_update(lease=lease, gpus=0)
    assert bad.value.details["gpus"] == ["must be 1 or more"]


@pytest.mark.django_db
def test_a_scheduled_lease_moves_with_its_waiting_vms_and_a_started_one_keeps_its_start(sent):
    make_host("gpu-a")  # 8 GPUs
    mine, other = roomy_project(), roomy_project()
    lease = reserve(mine, 6, hour(1), hour(3))
    worker = make_vm(mine, template=make_template(gpus=4), lease=lease)
    assert worker.state == VmState.PENDING  # waits for its lease's start
    reserve(other, 4, hour(5), hour(7), name="theirs")
    # Onto the other lease: refused with the earliest period that fits.
    with pytest.raises(Conflict) as refused:
        services.lease_update(lease=lease, starts_at=hour(4), ends_at=hour(6))
    assert refused.value.details["earliest_starts_at"] == [hour(7).isoformat()]
    # Half an hour later, over its own old period: it is set aside, so it fits.
    lease = services.lease_update(lease=lease, starts_at=hour(1.5), ends_at=hour(3.5))
    assert (lease.starts_at, lease.ends_at, lease.state) == (
        hour(1.5),
        hour(3.5),
        LeaseState.SCHEDULED,
    )
    audit = AuditEvent.objects.get(action="lease.update", object_id=str(lease.pk))
    assert audit.detail["previous_starts_at"] == hour(1).isoformat()
    assert audit.detail["starts_at"] == hour(1.5).isoformat()
    assert fresh(worker).lease_id == lease.pk and fresh(worker).state == VmState.PENDING
    assert hour(1.5).isoformat() in fresh(worker).state_reason  # the start it waits for
    with pytest.raises(Conflict) as too_small:  # the waiting VM would never fit
        services.lease_update(lease=lease, gpus=2)
    assert too_small.value.details == {"gpus": ["a VM in it needs 4"]}
    # Its start alone: its end stays.
    lease = services.lease_update(lease=lease, starts_at=hour(2))
    assert (lease.starts_at, lease.ends_at) == (hour(2), hour(3.5))
    # It takes hold of its GPUs at the lead before the new start, and then its start stays.
    assert services.leases_tick(now=hour(1) - LEAD)["prepared"] == 0
    assert services.leases_tick(now=hour(2) - LEAD)["prepared"] == 1
    with pytest.raises(Conflict) as started:
        services.lease_update(lease=lease, starts_at=hour(2.5))
    assert started.value.code == "lease_started"
    with pytest.raises(InvalidInput) as bad:
        services.lease_update(
            lease=reserve(mine, 1, hour(8), hour(9), name="x"), starts_at=hour(-1)
        )
    assert bad.value.details["starts_at"] == ["must not be in the past"]
