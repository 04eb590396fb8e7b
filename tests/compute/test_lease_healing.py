"""A lease whose GPUs are on a host that leaves service holds as many on hosts in service:
at the next tick it takes hold of GPUs elsewhere (whole hosts for a lease of whole hosts,
the spot VMs on them given their notice) and lets go of the ones on that host, except those
its own VMs still use there. One that finds too few keeps what it holds, says so once, and
tries again at every tick."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from compute import services
from compute.choices import HostState, LeaseState, Priority, VmState
from compute.models import Device, Host, LeaseAllocation
from compute.services import spot
from controlplane.models import AuditEvent, Event
from tests.compute.test_guarantees import MODEL, roomy_project
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_template, make_vm

LEAD = timedelta(seconds=settings.LEASE_LEAD_S)


@pytest.fixture
def at():
    """The test's clock: ``at(n)`` is n hours from one instant read once."""
    now = timezone.now().replace(microsecond=0)
    return lambda hours: now + timedelta(hours=hours)


def _started(project, at, **size):
    """A lease of ``size`` (``gpus=`` or ``hosts=``) from at(1) to at(3), past its start."""
    lease = services.lease_create(
        project=project, name="run", starts_at=at(1), ends_at=at(3), gpu_model=MODEL, **size
    )
    assert services.leases_tick(now=at(1) - LEAD)["prepared"] == 1
    assert services.leases_tick(now=at(1))["started"] == 1
    lease.refresh_from_db()
    return lease


def _hosts_held(lease) -> dict[str, int]:
    held = Device.objects.filter(lease=lease).values_list("host__name", flat=True)
    return {name: list(held).count(name) for name in set(held)}


def _out_of_service(name: str) -> Host:
    return services.host_set_state(
        host=Host.objects.get(name=name), state=HostState.MAINTENANCE, reason="repair"
    )


@pytest.mark.django_db
def test_a_lease_moves_off_a_host_that_left_service_and_notices_the_spot_vm_in_the_way(sent, at):
    make_host("gpu-a"), make_host("gpu-b")
    mine, other = roomy_project(), roomy_project()
    lease = _started(mine, at, gpus=4)
    assert _hosts_held(lease) == {"gpu-a": 4}
    # A spot VM of another project fills the other host.
    borrower = make_vm(other, template=make_template(gpus=8), priority=Priority.SPOT)
    report(fresh(borrower), "running")
    assert fresh(borrower).host.name == "gpu-b"

    _out_of_service("gpu-a")
    moved_at = at(1.5)
    done = services.leases_tick(now=moved_at)
    assert done["healed"] == 1
    assert _hosts_held(lease) == {"gpu-b": 4}
    # The GPUs on gpu-a are no lease's from now; those on gpu-b are this one's to its end.
    lost = LeaseAllocation.objects.filter(lease=lease, device__host__name="gpu-a")
    assert lost.count() == 4 and set(lost.values_list("ends_at", flat=True)) == {moved_at}
    taken = LeaseAllocation.objects.filter(lease=lease, device__host__name="gpu-b")
    assert set(taken.values_list("starts_at", "ends_at")) == {(moved_at, at(3))}
    # The spot VM on them gets its full notice.
    borrower = fresh(borrower)
    assert borrower.state == VmState.EVICTING
    assert borrower.eviction_deadline == moved_at + timedelta(
        seconds=borrower.template.eviction_notice_s
    )
    heal = AuditEvent.objects.get(action="lease.heal", object_id=str(lease.pk))
    assert heal.detail == {"held": 4, "let_go": 4, "hosts_left": ["gpu-a"], "spot_noticed": 1}
    told = Event.objects.filter(kind="lease.updated", project=mine).latest("pk")
    assert told.message == (
        "lease run took hold of 4 GPUs on hosts in service and let go of 4 GPUs on hosts that "
        "left service (gpu-a)"
    )
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE and lease.state_reason == ""

    # Nothing more to do at the next tick; once the spot VM has stopped, a VM of the lease
    # runs on the GPUs it holds now.
    assert services.leases_tick(now=at(1.6))["healed"] == 0
    spot.evictions_reap(now=borrower.eviction_deadline)
    report(fresh(borrower), "shutoff")
    worker = fresh(make_vm(mine, template=make_template(gpus=4), lease=lease))
    assert worker.state == VmState.PROVISIONING and worker.host.name == "gpu-b"
    assert Device.objects.filter(vm=worker, lease=lease).count() == 4


@pytest.mark.django_db
def test_a_lease_that_finds_too_few_keeps_what_it_holds_says_so_once_and_tries_again(sent, at):
    make_host("gpu-a"), make_host("gpu-b")
    mine = roomy_project()
    _out_of_service("gpu-b")
    lease = _started(mine, at, gpus=4)
    assert _hosts_held(lease) == {"gpu-a": 4}

    _out_of_service("gpu-a")
    for hour in (1.5, 1.6):
        services.leases_tick(now=at(hour))
    # Nowhere to go: it keeps the GPUs of gpu-a (they are back with the host) and is at risk.
    assert _hosts_held(lease) == {"gpu-a": 4}
    lease.refresh_from_db()
    assert lease.state_reason == "holding 0 of 4 GPUs"
    alerts = Event.objects.filter(kind="lease.at_risk", project=mine)
    assert alerts.count() == 1 and "holds 0 of its 4" in alerts.get().message
    assert not AuditEvent.objects.filter(action="lease.heal").exists()

    # A host returns to service: the next tick moves the lease there.
    services.host_set_state(host=Host.objects.get(name="gpu-b"), state=HostState.UP)
    assert services.leases_tick(now=at(1.7))["healed"] == 1
    assert _hosts_held(lease) == {"gpu-b": 4}
    lease.refresh_from_db()
    assert lease.state_reason == ""
    assert services.leases_tick(now=at(1.8))["healed"] == 0


@pytest.mark.django_db
def test_the_gpus_its_own_vms_use_on_the_host_stay_held_until_they_leave(sent, at):
    make_host("gpu-a"), make_host("gpu-b")
    mine = roomy_project()
    lease = _started(mine, at, gpus=4)
    worker = fresh(make_vm(mine, template=make_template(gpus=2), lease=lease))
    assert worker.host.name == "gpu-a"
    report(worker, "running")

    _out_of_service("gpu-a")
    assert services.leases_tick(now=at(1.5))["healed"] == 1
    # Four in service on gpu-b, and the two its VM still runs on: only the idle two went.
    assert _hosts_held(lease) == {"gpu-a": 2, "gpu-b": 4}
    kept = Device.objects.filter(lease=lease, host__name="gpu-a")
    assert set(kept.values_list("vm", flat=True)) == {worker.pk}
    assert AuditEvent.objects.get(action="lease.heal").detail["let_go"] == 2

    # The VM leaves: its two GPUs go at the next tick.
    services.vm_delete(vm=fresh(worker))
    report(fresh(worker), "absent")
    assert services.leases_tick(now=at(1.6))["healed"] == 1
    assert _hosts_held(lease) == {"gpu-b": 4}
    told = Event.objects.filter(kind="lease.updated", project=mine).latest("pk")
    assert told.message == "lease run let go of 2 GPUs on hosts that left service (gpu-a)"
    assert services.leases_tick(now=at(1.7))["healed"] == 0


@pytest.mark.django_db
def test_a_lease_of_whole_hosts_takes_a_whole_host_in_place_of_one_that_left(sent, at):
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        make_host(name)
    mine, other = roomy_project(), roomy_project()
    lease = _started(mine, at, hosts=1)
    ((first, eight),) = _hosts_held(lease).items()
    assert eight == 8
    # An on-demand VM pins one of the two other hosts: only the third is whole.
    pinning = fresh(make_vm(other, template=make_template(gpus=1)))
    assert pinning.host.name != first
    (whole,) = {"gpu-a", "gpu-b", "gpu-c"} - {first, pinning.host.name}

    _out_of_service(first)
    assert services.leases_tick(now=at(1.5))["healed"] == 1
    assert _hosts_held(lease) == {whole: 8}
    assert fresh(pinning).state == VmState.PROVISIONING  # on-demand work is never moved


@pytest.mark.django_db
def test_a_lease_of_whole_hosts_keeps_its_host_when_one_gpu_of_it_is_gone(sent, at):
    make_host("gpu-a"), make_host("gpu-b")
    lease = _started(roomy_project(), at, hosts=1)
    ((host, _),) = _hosts_held(lease).items()
    # As an inventory report without it leaves it: the host is up, one of its GPUs gone.
    Device.objects.filter(pk=Device.objects.filter(lease=lease).first().pk).update(present=False)
    assert services.leases_tick(now=at(1.5))["healed"] == 0
    assert _hosts_held(lease) == {host: 8}
    assert not Event.objects.filter(kind="lease.at_risk").exists()
