"""Leases hold capacity over time: admission counts them against the fleet with guarantees
and on-demand VMs, and refuses a double booking with the earliest period that fits (under
concurrency on PostgreSQL too, where the database itself refuses one GPU in two leases at
once); before its start a lease takes its GPUs and gives the spot VMs on them their full
notice; its VMs are placed there, billed at the reserved factor, and shelved at its end."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from compute import services
from compute.choices import HostState, LeaseState, Priority, VmState
from compute.models import Device, Lease, LeaseAllocation
from compute.services import leases, spot
from controlplane.errors import Conflict, InvalidInput
from controlplane.models import AuditEvent, Event
from tenants.models import UsageRecord
from tests.compute.test_guarantees import MODEL, _race, roomy_project
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_image, make_template, make_vm

LEAD = timedelta(seconds=settings.LEASE_LEAD_S)


_now: list = []  # the test's "now", read once: hour(1) and hour(3) are exactly 2 h apart


@pytest.fixture(autouse=True)
def _one_now():
    _now[:] = [timezone.now().replace(microsecond=0)]


def hour(n: float):
    return _now[0] + timedelta(hours=n)


def reserve(project, gpus, start, end, **more):
    return services.lease_create(
        project=project, name=more.pop("name", f"run-{gpus}-{start:%H%M}"), gpus=gpus,
        starts_at=start, ends_at=end, gpu_model=MODEL, **more,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_lease_from_admission_to_its_end(sent):
    make_host("gpu-a")  # 8 GPUs
    mine, other = roomy_project(), roomy_project()
    t8, t4 = make_template(gpus=8, eviction_notice_s=60), make_template(gpus=4)
    start, end = hour(1), hour(3)
    lease = reserve(mine, 4, start, end)
    assert lease.state == LeaseState.SCHEDULED
    assert AuditEvent.objects.filter(action="lease.create", object_id=str(lease.pk)).exists()

    # Another project's on-demand VM cannot take what the lease will need...
    refused = make_vm(other, template=t8)
    assert refused.state == VmState.PENDING
    assert "reserved by leases (4 GPUs)" in refused.state_reason
    # ...but a spot VM may run there until the lease takes its GPUs.
    borrower = make_vm(other, template=t8, priority=Priority.SPOT)
    assert borrower.state == VmState.PROVISIONING
    report(fresh(borrower), "running")
    # A VM created in the lease waits for its start.
    worker = make_vm(mine, template=t4, lease=lease)
    assert worker.state == VmState.PENDING and "waits for its lease" in worker.state_reason

    # The lead before the start: four GPUs held, the spot VM on them gets its full notice.
    prepared_at = start - LEAD
    assert services.leases_tick(now=prepared_at)["prepared"] == 1
    lease.refresh_from_db()
    assert lease.state == LeaseState.PREPARING
    held = Device.objects.filter(lease=lease)
    assert held.count() == 4
    assert LeaseAllocation.objects.filter(lease=lease, starts_at=start, ends_at=end).count() == 4
    borrower = fresh(borrower)
    assert borrower.state == VmState.EVICTING
    assert borrower.eviction_deadline == prepared_at + timedelta(seconds=60)
    assert borrower.eviction_deadline < start  # the notice ends before the lease starts
    spot.evictions_reap(now=borrower.eviction_deadline)
    report(fresh(borrower), "shutoff")
    assert fresh(borrower).state == VmState.EVICTED
    assert held.filter(vm__isnull=True).count() == 4

    # Nobody else gets the held GPUs meanwhile, on-demand or spot.
    services.vm_schedule_pending()
    assert fresh(refused).state == VmState.PENDING and fresh(worker).state == VmState.PENDING
    probes = [make_vm(other, template=t4, priority=Priority.SPOT) for _ in range(2)]
    assert [p.state for p in probes] == [VmState.PROVISIONING, VmState.PENDING]
    assert not Device.objects.filter(vm=probes[0], lease__isnull=False).exists()
    for probe in probes:
        services.vm_delete(vm=fresh(probe))
    report(fresh(probes[0]), "absent")

    # The start: the lease's VM is placed on its GPUs; the lease is billed, reserved.
    assert services.leases_tick(now=start)["started"] == 1
    services.vm_schedule_pending()
    worker = fresh(worker)
    assert worker.state == VmState.PROVISIONING
    assert set(Device.objects.filter(vm=worker).values_list("lease", flat=True)) == {lease.pk}
    bill = UsageRecord.objects.get(subject_type="compute.lease", subject_id=str(lease.pk))
    assert (bill.resource, bill.quantity, bill.priority) == ("gpu", 4, "reserved")
    assert bill.started_at == start and bill.ended_at is None
    mine_open = UsageRecord.objects.filter(subject_id=str(worker.pk), ended_at__isnull=True)
    assert {(r.resource, r.priority) for r in mine_open} == {
        ("vcpu", "reserved"),
        ("memory", "reserved"),
    }  # its GPUs are the lease's
    report(worker, "running")

    # The lead before the end: the project is told; at the end its VMs are shelved.
    assert services.leases_tick(now=end - LEAD)["warned"] == 1
    ending = Event.objects.get(kind="lease.ending", project=mine)
    assert worker.name in ending.message
    assert services.leases_tick(now=end)["ended"] == 1
    lease.refresh_from_db()
    assert lease.state == LeaseState.ENDED and lease.ended_at == end
    worker = fresh(worker)
    assert worker.state == VmState.SHELVING and worker.lease_id is None
    assert not Device.objects.filter(lease=lease).exists()
    bill.refresh_from_db()
    assert bill.ended_at == end
    # Once the host has kept its disk, the GPUs are anyone's: the waiting VM gets them.
    report(worker, "absent")
    assert fresh(worker).state == VmState.SHELVED
    services.vm_schedule_pending()
    assert fresh(refused).state == VmState.PROVISIONING


@pytest.mark.django_db
def test_a_double_booking_is_refused_with_the_earliest_period_that_fits():
    make_host("gpu-a")
    project = roomy_project()
    reserve(project, 8, hour(1), hour(3), name="first")
    with pytest.raises(Conflict) as refused:
        reserve(project, 4, hour(2), hour(4), name="second")
    assert refused.value.code == "no_capacity"
    assert refused.value.details["earliest_starts_at"] == [hour(3).isoformat()]
    assert refused.value.details["earliest_ends_at"] == [hour(5).isoformat()]
    assert not Lease.objects.filter(name="second").exists()
    # Back to back is no overlap.
    assert reserve(project, 8, hour(3), hour(5), name="third").state == LeaseState.SCHEDULED


@pytest.mark.django_db
def test_on_demand_use_and_guarantees_count_for_as_long_as_they_last(sent):
    make_host("gpu-a")
    holder, guaranteed, project = roomy_project(), roomy_project(), roomy_project()
    make_vm(holder, template=make_template(gpus=4))  # on demand: it has no end
    services.guarantee_set(project=guaranteed, min_gpus=2, gpu_model=MODEL)
    with pytest.raises(Conflict) as refused:
        reserve(project, 4, hour(24), hour(26))
    assert "no period fits" in refused.value.message
    assert reserve(project, 2, hour(24), hour(26)).gpus == 2
    # Guarantees and leases together never promise more than the fleet.
    with pytest.raises(Conflict) as over:
        services.guarantee_set(project=guaranteed, min_gpus=7, gpu_model=MODEL)
    assert over.value.code == "over_promised" and "1 too many" in over.value.message
    assert services.guarantee_set(project=guaranteed, min_gpus=6, gpu_model=MODEL).min_gpus == 6


@pytest.mark.django_db
def test_bad_input_names_the_field():
    make_host("gpu-a")
    project = roomy_project()
    cases = {
        "gpus": dict(gpus=0, start=hour(1), end=hour(2)),
        "ends_at": dict(gpus=1, start=hour(2), end=hour(1)),
        "starts_at": dict(gpus=1, start=hour(-2), end=hour(1)),
    }
    for field, case in cases.items():
        with pytest.raises(InvalidInput) as bad:
            reserve(project, case["gpus"], case["start"], case["end"])
        assert field in bad.value.details
    with pytest.raises(InvalidInput) as bad:
        services.lease_create(
            project=project, name="x", gpus=1, starts_at=hour(1), ends_at=hour(2), gpu_model="H9"
        )
    assert "gpu_model" in bad.value.details


@pytest.mark.django_db
def test_a_vm_in_a_lease_must_fit_it(sent):
    make_host("gpu-a")
    project, other = roomy_project(), roomy_project()
    lease = reserve(project, 2, hour(1), hour(2))
    for template, priority, why in [
        (make_template(gpus=4), Priority.ON_DEMAND, "holds only 2"),
        (make_template(), Priority.ON_DEMAND, "GPU template"),
        (make_template(gpus=2, spot_allowed=True), Priority.SPOT, "not spot"),
    ]:
        with pytest.raises(InvalidInput) as bad:
            make_vm(project, template=template, priority=priority, lease=lease)
        assert why in bad.value.details["lease"][0]
    with pytest.raises(InvalidInput):
        make_vm(other, template=make_template(gpus=2), lease=lease)  # another project's


@pytest.mark.django_db
def test_cancelling_before_the_start_bills_nothing_and_frees_the_count(sent):
    make_host("gpu-a")
    project, other = roomy_project(), roomy_project()
    lease = reserve(project, 8, hour(1), hour(2))
    waiting = make_vm(project, template=make_template(gpus=8), lease=lease)
    services.lease_cancel(lease=lease)
    lease.refresh_from_db()
    assert lease.state == LeaseState.CANCELLED
    assert not UsageRecord.objects.filter(subject_type="compute.lease").exists()
    waiting = fresh(waiting)
    assert waiting.lease_id is None and "cancelled" in waiting.state_reason
    # Nothing is reserved any more: on-demand may take the GPUs (or waits for the released
    # VM, placed first, and not for a lease).
    taker = make_vm(other, template=make_template(gpus=8))
    assert "lease" not in taker.state_reason
    services.vm_schedule_pending()
    assert Device.objects.filter(vm__isnull=False).count() == 8


# --- PostgreSQL: the database refuses a double booking, and admissions race safely -----------


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_database_refuses_one_gpu_in_two_overlapping_leases():
    host = make_host("gpu-a")
    project = roomy_project()
    device = Device.objects.filter(host=host).first()
    a = Lease.objects.create(
        project=project, name="a", gpu_model=MODEL, gpus=1, starts_at=hour(1), ends_at=hour(3)
    )
    b = Lease.objects.create(
        project=project, name="b", gpu_model=MODEL, gpus=1, starts_at=hour(2), ends_at=hour(4)
    )
    LeaseAllocation.objects.create(lease=a, device=device, starts_at=hour(1), ends_at=hour(3))
    with pytest.raises(IntegrityError), transaction.atomic():
        LeaseAllocation.objects.create(lease=b, device=device, starts_at=hour(2), ends_at=hour(4))
    # Back to back on the same GPU is fine.
    LeaseAllocation.objects.create(lease=b, device=device, starts_at=hour(3), ends_at=hour(4))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_leases_never_double_book():
    make_host("gpu-a")
    make_host("gpu-b")  # 16 GPUs: at most five leases of 3 at once
    projects = [roomy_project() for _ in range(8)]
    start, end = hour(1), hour(2)

    def book(index):
        reserve(projects[index], 3, start, end, name=f"l{index}")
        return "ok"

    results, errors = _race(8, book)
    assert errors == []
    assert results.count("ok") == 5 and results.count("no_capacity") == 3
    assert sum(Lease.objects.values_list("gpus", flat=True)) == 15
    # And when they take hold of GPUs, no GPU is held twice.
    services.leases_tick(now=start - LEAD)
    held = list(LeaseAllocation.objects.values_list("device_id", flat=True))
    assert len(held) == 15 == len(set(held))


@pytest.mark.django_db
def test_the_tick_is_idempotent(sent):
    make_host("gpu-a")
    project = roomy_project()
    lease = reserve(project, 2, hour(1), hour(2))
    at = hour(1) - LEAD
    assert leases.leases_tick(now=at)["prepared"] == 1
    assert leases.leases_tick(now=at) == {
        "prepared": 0, "started": 0, "warned": 0, "ended": 0, "healed": 0,
    }  # fmt: skip
    assert LeaseAllocation.objects.filter(lease=lease).count() == 2


@pytest.mark.django_db
def test_a_lease_of_whole_hosts_takes_every_gpu_of_hosts_no_one_else_holds(sent):
    hosts = [make_host(f"gpu-{c}") for c in "abc"]
    mine, other, guaranteed = roomy_project(), roomy_project(), roomy_project()
    pinning = make_vm(other, template=make_template(gpus=1))  # on demand: it pins its host
    pinned_host = fresh(pinning).host
    # A guarantee not in use may pin a host of its own once its project asks.
    services.guarantee_set(project=guaranteed, min_gpus=1, gpu_model=MODEL)
    borrower = make_vm(other, template=make_template(gpus=4), priority=Priority.SPOT)
    report(fresh(borrower), "running")
    start, end = hour(1), hour(3)
    lease = services.lease_create(
        project=mine, name="nodes", hosts=1, starts_at=start, ends_at=end, gpu_model=MODEL
    )
    assert (lease.hosts, lease.gpus) == (1, 8)
    audit = AuditEvent.objects.get(action="lease.create", object_id=str(lease.pk))
    assert audit.detail["hosts"] == 1

    # Two whole hosts: 22 GPUs are free, but the on-demand VM and the guarantee leave only
    # one host whole.
    with pytest.raises(Conflict) as refused:
        services.lease_create(
            project=mine, name="two", hosts=2, starts_at=hour(5), ends_at=hour(6), gpu_model=MODEL
        )
    assert "hosts" in refused.value.details and "whole" in refused.value.message
    assert "no period fits" in refused.value.message
    # While it overlaps, a lease of GPUs counts the hosts its GPUs fill: 4 GPUs fit by
    # count (14 free) but no host is left whole for them, until the lease of hosts ends.
    with pytest.raises(Conflict) as refused:
        reserve(other, 4, hour(2), hour(4), name="gpus")
    assert "whole" in refused.value.message
    assert refused.value.details["earliest_starts_at"] == [end.isoformat()]
    assert reserve(other, 4, end, hour(4), name="after").gpus == 4

    # Its lead: every GPU of the one host on-demand work leaves whole; the spot VM there
    # (if any) gets its notice.
    services.leases_tick(now=start - LEAD)
    held = Device.objects.filter(lease=lease)
    assert held.count() == 8
    (host_id,) = set(held.values_list("host_id", flat=True))
    assert host_id != pinned_host.pk and host_id in {h.pk for h in hosts}
    borrower = fresh(borrower)
    if borrower.host_id == host_id:
        assert borrower.state == VmState.EVICTING
        spot.evictions_reap(now=borrower.eviction_deadline)
        report(fresh(borrower), "shutoff")
    # From its start an 8-GPU VM runs in it: a whole host is what it needs.
    services.leases_tick(now=start)
    worker = make_vm(mine, template=make_template(gpus=8), lease=lease)
    worker = fresh(worker)
    assert worker.state == VmState.PROVISIONING and worker.host_id == host_id


@pytest.mark.django_db
def test_whole_hosts_bad_input_names_the_field():
    host = make_host("gpu-a")
    make_host("gpu-b")
    project = roomy_project()
    for fields, field in [
        (dict(gpus=8, hosts=1), "gpus"),
        (dict(), "gpus"),
        (dict(hosts=0), "hosts"),
    ]:
        with pytest.raises(InvalidInput) as bad:
            services.lease_create(
                project=project, name="x", starts_at=hour(1), ends_at=hour(2), gpu_model=MODEL,
                **fields,
            )  # fmt: skip
        assert field in bad.value.details
    # Hosts holding different numbers of GPUs have no one size of "a whole host".
    Device.objects.filter(pk__in=Device.objects.filter(host=host).values("pk")[:2]).update(
        present=False
    )
    with pytest.raises(InvalidInput) as bad:
        services.lease_create(
            project=project, name="x", hosts=1, starts_at=hour(1), ends_at=hour(2), gpu_model=MODEL
        )
    assert "different numbers" in bad.value.details["hosts"][0]


@pytest.mark.django_db
def test_a_lease_of_whole_hosts_that_finds_none_whole_holds_nothing_and_says_so(sent):
    hosts = [make_host("gpu-a"), make_host("gpu-b")]
    mine, other = roomy_project(), roomy_project()
    lease = services.lease_create(
        project=mine, name="node", hosts=1, starts_at=hour(1), ends_at=hour(2), gpu_model=MODEL
    )
    vm = fresh(make_vm(other, template=make_template(gpus=1)))  # on demand, after the admission
    # Whichever of the two equally good hosts it went to, the other one goes away.
    (spare,) = [h for h in hosts if h.pk != vm.host_id]
    services.host_set_state(host=spare, state=HostState.MAINTENANCE)
    services.leases_tick(now=hour(1) - LEAD)
    # Seven GPUs are free, all on the host the on-demand VM uses: none of them is taken.
    assert not Device.objects.filter(lease=lease).exists()
    alert = Event.objects.get(kind="lease.at_risk", project=mine)
    assert "holds 0 of its 8" in alert.message and "1 whole hosts" in alert.message


def _pinned_and_spot(*spot_sizes):
    """Two hosts: an on-demand 1-GPU VM pins one of them, then spot VMs of ``spot_sizes``
    GPUs (running) fill what they can, each where the scheduler packs it."""
    make_host("gpu-a"), make_host("gpu-b")
    other = roomy_project()
    pinning = fresh(make_vm(other, template=make_template(gpus=1)))
    spots = []
    for gpus in spot_sizes:
        vm = make_vm(other, template=make_template(gpus=gpus), priority=Priority.SPOT)
        report(fresh(vm), "running")
        spots.append(fresh(vm))
    return other, pinning.host_id, spots


def _hand_over(victim):
    spot.evictions_reap(now=victim.eviction_deadline)
    report(fresh(victim), "shutoff")


@pytest.mark.django_db
def test_an_on_demand_vm_takes_no_host_a_lease_of_whole_hosts_needs(sent):
    # The pinned host's other cell runs a 4-GPU spot VM; the other host is free.
    other, pinned, (borrower,) = _pinned_and_spot(4)
    assert borrower.host_id == pinned  # packed beside the on-demand VM
    mine = roomy_project()
    lease = services.lease_create(
        project=mine, name="node", hosts=1, starts_at=hour(1), ends_at=hour(3), gpu_model=MODEL
    )
    # A 4-GPU on-demand VM is admitted by GPUs (1 + 4 of 16, 8 leased), and the free host
    # has room for it; but it has no end, and the lease needs that host whole. It takes the
    # spot VM's cell on the host on-demand work already holds instead.
    vm = fresh(make_vm(other, template=make_template(gpus=4)))
    assert vm.state == VmState.PENDING and vm.reserved_host_id == pinned
    assert fresh(borrower).state == VmState.EVICTING
    _hand_over(fresh(borrower))
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING and vm.host_id == pinned
    # At its lead the lease finds its host whole: no alert.
    services.leases_tick(now=hour(1) - LEAD)
    held = Device.objects.filter(lease=lease)
    assert held.count() == 8 and set(held.values_list("host_id", flat=True)) != {pinned}
    assert not Event.objects.filter(kind="lease.at_risk").exists()


@pytest.mark.django_db
def test_an_on_demand_vm_that_only_a_needed_host_fits_waits(sent):
    make_host("gpu-a"), make_host("gpu-b")
    other = roomy_project()
    # An on-demand VM with one GPU and most of its host's memory pins that host.
    big = fresh(make_vm(other, template=make_template(gpus=1, memory_gib=400)))
    services.lease_create(
        project=roomy_project(), name="node", hosts=1, starts_at=hour(1), ends_at=hour(3),
        gpu_model=MODEL,
    )  # fmt: skip
    # 1 + 2 + 8 leased of 16 GPUs: admitted by count, but only the free host has the
    # memory, and the lease needs it whole: it waits, saying why, and takes nothing.
    vm = fresh(make_vm(other, template=make_template(gpus=2)))
    assert vm.state == VmState.PENDING and vm.host_id is None and not vm.reserved_host_id
    assert "reserved whole by leases (1 hosts)" in vm.state_reason
    assert not Device.objects.filter(vm__isnull=False).exclude(host_id=big.host_id).exists()
    # One that fits beside it goes there, as it always would.
    small = fresh(make_vm(other, template=make_template(gpus=1, memory_gib=16)))
    assert small.state == VmState.PROVISIONING and small.host_id == big.host_id


@pytest.mark.django_db
def test_an_eviction_for_an_on_demand_vm_spares_the_host_a_lease_of_whole_hosts_needs(sent):
    # Spot VMs pack: three of 2 GPUs beside the on-demand VM, two of 4 on the other host.
    other, pinned, spots = _pinned_and_spot(2, 2, 2, 4, 4)
    assert [vm.host_id == pinned for vm in spots] == [True, True, True, False, False]
    services.lease_create(
        project=roomy_project(), name="node", hosts=1, starts_at=hour(1), ends_at=hour(3),
        gpu_model=MODEL,
    )  # fmt: skip
    # Room for 4 GPUs: one eviction on the other host, or two on the pinned one. Only the
    # pinned host may take an on-demand VM while the lease needs the other whole.
    vm = fresh(make_vm(other, template=make_template(gpus=4)))
    assert vm.reserved_host_id == pinned
    evicting = [s for s in spots if fresh(s).state == VmState.EVICTING]
    assert len(evicting) == 2 and all(s.host_id == pinned and s.gpus == 2 for s in evicting)
    for victim in evicting:
        _hand_over(fresh(victim))
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING and vm.host_id == pinned
    assert all(fresh(s).state == VmState.RUNNING for s in spots if s.host_id != pinned)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_on_demand_vms_leave_a_lease_of_whole_hosts_its_hosts(sent):
    for c in "abc":
        make_host(f"gpu-{c}")
    services.lease_create(
        project=roomy_project(), name="node", hosts=1, starts_at=hour(1), ends_at=hour(3),
        gpu_model=MODEL,
    )  # fmt: skip
    # Each needs a host to itself (its memory) and 2 GPUs: 4 fit by GPUs (8 + 8 leased of
    # 24), 3 by memory, but only 2 may take a host while the lease needs one whole.
    projects = [roomy_project() for _ in range(2)]
    template, image = make_template(gpus=2, memory_gib=400), make_image()

    def create(index):
        vm, _ = services.vm_create(
            project=projects[index % 2],
            name=f"big-{index}",
            template=template,
            image=image,
            wait_for_capacity=False,
        )
        return vm.state

    results, errors = _race(4, create)
    assert errors == []
    assert results.count(VmState.PROVISIONING) == 2 and results.count("no_capacity") == 2
    hosts = Device.objects.filter(vm__isnull=False).values_list("host_id", flat=True)
    assert len(set(hosts)) == 2
