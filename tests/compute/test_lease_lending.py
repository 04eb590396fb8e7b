"""A lease lends the GPUs its VMs leave idle: while it is active, a spot VM that finds no
other room runs on them; a VM of the lease that needs them gives that borrower its full
eviction notice and takes the GPUs at the hand-over; the GPUs stay the lease's throughout,
and no on-demand VM of another project ever gets them. A lease that does not lend keeps
them idle, and the claim itself refuses lent GPUs that are not lent now."""

from dataclasses import replace
from datetime import timedelta

import pytest

from compute import placement, services
from compute.choices import LeaseState, Priority, VmState
from compute.claims import ClaimConflict
from compute.models import Device, Lease, VirtualMachine
from compute.scheduler import Placement
from compute.services import spot
from controlplane import audit
from controlplane.errors import Conflict
from controlplane.models import AuditEvent
from tests.compute.test_guarantees import _race, roomy_project
from tests.compute.test_leases import LEAD, _one_now, hour, reserve  # noqa: F401 (autouse)
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_image, make_template, make_vm

pytestmark = pytest.mark.django_db


def _active(lease: Lease) -> Lease:
    """``lease`` past its start: its GPUs held (no spot VM was on them), then active."""
    assert services.leases_tick(now=lease.starts_at - LEAD)["prepared"] == 1
    assert services.leases_tick(now=lease.starts_at)["started"] == 1
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    return lease


def _running(vm):
    report(fresh(vm), "running")
    return fresh(vm)


def test_spot_borrows_idle_lease_gpus_and_gives_them_back_with_full_notice(sent):
    make_host("gpu-a")  # 8 GPUs, two cells of 4
    mine, other = roomy_project(), roomy_project()
    four = make_template(gpus=4, eviction_notice_s=90)
    lease = _active(reserve(mine, 4, hour(1), hour(3)))
    leased = Device.objects.filter(lease=lease)
    assert leased.count() == 4

    # Spot takes the fleet's own free GPUs first; only then does it borrow the lease's.
    first = make_vm(other, template=four, priority=Priority.SPOT)
    assert first.state == VmState.PROVISIONING
    assert not Device.objects.filter(vm=first, lease__isnull=False).exists()
    borrower = make_vm(other, template=four, priority=Priority.SPOT)
    assert borrower.state == VmState.PROVISIONING
    assert set(Device.objects.filter(vm=borrower).values_list("lease", flat=True)) == {lease.pk}
    borrower = _running(borrower)

    # Another project's on-demand VM never gets them, borrowed or idle.
    outsider = make_vm(other, template=four)
    assert outsider.state == VmState.PENDING
    services.vm_schedule_pending()
    assert not Device.objects.filter(vm=outsider).exists()

    # A VM of the lease that needs them: the borrower gets its full notice; the VM waits
    # for it, with the host held for it.
    worker = make_vm(mine, template=four, lease=lease)
    assert worker.state == VmState.PENDING
    assert "waiting for 1 spot VM(s) on gpu-a" in worker.state_reason
    borrower = fresh(borrower)
    assert borrower.state == VmState.EVICTING and borrower.evicted_for_id == worker.pk
    assert borrower.eviction_deadline == borrower.eviction_notice_at + timedelta(seconds=90)
    assert AuditEvent.objects.filter(action="vm.eviction_notice", object_id=str(borrower.pk))
    # The GPUs stay the lease's while lent; another pass changes nothing meanwhile.
    assert leased.count() == 4
    services.vm_schedule_pending()
    assert fresh(worker).state == VmState.PENDING

    # The notice ends, the borrower's guest stops: the hand-over gives the worker the GPUs.
    spot.evictions_reap(now=borrower.eviction_deadline)
    report(fresh(borrower), "shutoff")
    assert fresh(borrower).state == VmState.EVICTED
    worker = fresh(worker)
    assert worker.state == VmState.PROVISIONING and worker.reserved_host_id is None
    assert set(Device.objects.filter(vm=worker).values_list("lease", flat=True)) == {lease.pk}

    # The borrower, started again, finds no room: the lease's GPUs are in use now.
    services.vm_start_evicted(vm=fresh(borrower))
    assert fresh(borrower).state == VmState.PENDING


def test_a_borrower_outlives_the_lease_it_borrowed_from(sent):
    make_host("gpu-a")
    mine, other = roomy_project(), roomy_project()
    lease = _active(reserve(mine, 8, hour(1), hour(2)))
    borrower = _running(make_vm(other, template=make_template(gpus=8), priority=Priority.SPOT))
    assert Device.objects.filter(vm=borrower, lease=lease).count() == 8

    assert services.leases_tick(now=lease.ends_at)["ended"] == 1
    # Not the lease's VM: it is neither shelved nor noticed; the GPUs are simply no lease's.
    borrower = fresh(borrower)
    assert borrower.state == VmState.RUNNING
    assert Device.objects.filter(vm=borrower, lease__isnull=True).count() == 8


def test_a_lease_that_does_not_lend_keeps_its_idle_gpus_idle(sent):
    make_host("gpu-a")
    mine, other = roomy_project(), roomy_project()
    lease = _active(reserve(mine, 8, hour(1), hour(2), lend_idle=False))
    waiting = make_vm(other, template=make_template(gpus=2), priority=Priority.SPOT)
    services.vm_schedule_pending()
    assert fresh(waiting).state == VmState.PENDING
    assert not Device.objects.filter(lease=lease, vm__isnull=False).exists()
    # Its own VMs start at once: nothing to evict.
    worker = make_vm(mine, template=make_template(gpus=8), lease=lease)
    assert worker.state == VmState.PROVISIONING
    audit = AuditEvent.objects.get(action="lease.create", object_id=str(lease.pk))
    assert audit.detail["lend_idle"] is False


def test_a_lease_that_stops_lending_notices_its_borrowers_and_its_vms_start_at_once(sent):
    make_host("gpu-a")
    mine, other = roomy_project(), roomy_project()
    four = make_template(gpus=4, eviction_notice_s=90)
    lease = _active(reserve(mine, 8, hour(1), hour(3)))
    borrower = _running(make_vm(other, template=four, priority=Priority.SPOT))
    assert Device.objects.filter(vm=borrower, lease=lease).count() == 4

    with audit.audit_context(actor=mine.owner, ip_address="192.0.2.7"):
        lease = services.lease_update(lease=lease, lend_idle=False)
    assert fresh_lease(lease).lend_idle is False
    # The borrower gets its full notice now, for no VM in particular: the GPUs go idle.
    borrower = fresh(borrower)
    assert borrower.state == VmState.EVICTING and borrower.evicted_for_id is None
    assert borrower.eviction_deadline == borrower.eviction_notice_at + timedelta(seconds=90)
    assert "no longer lends its GPUs" in borrower.state_reason
    update = AuditEvent.objects.get(action="lease.update", object_id=str(lease.pk))
    assert update.detail == {"lend_idle": False, "spot_noticed": 1}
    assert update.actor == mine.owner and update.project == mine
    # The borrower is another project's: its trail names the scheduler, not who changed it.
    notice = AuditEvent.objects.get(action="vm.eviction_notice", object_id=str(borrower.pk))
    assert (notice.actor, notice.actor_name, notice.ip_address) == (None, "scheduler", None)
    # No spot VM borrows from it any more, not even with the view fresh.
    waiting = make_vm(other, template=four, priority=Priority.SPOT)
    assert waiting.state == VmState.PENDING
    spot.evictions_reap(now=borrower.eviction_deadline)
    report(fresh(borrower), "shutoff")
    assert fresh(borrower).state == VmState.EVICTED
    services.vm_schedule_pending()
    assert fresh(waiting).state == VmState.PENDING
    assert not Device.objects.filter(lease=lease, vm__isnull=False).exists()
    # Its own VMs start at once: nothing to evict.
    worker = make_vm(mine, template=make_template(gpus=8), lease=lease)
    assert worker.state == VmState.PROVISIONING

    # Lending again lets the waiting spot VM borrow what the worker leaves idle.
    services.vm_delete(vm=fresh(worker))
    report(fresh(worker), "absent")
    services.vm_schedule_pending()
    assert fresh(waiting).state == VmState.PENDING  # idle, but kept for the lease's VMs
    services.lease_update(lease=lease, lend_idle=True)
    services.vm_schedule_pending()
    assert fresh(waiting).state == VmState.PROVISIONING
    assert Device.objects.filter(vm=waiting, lease=lease).count() == 4
    assert AuditEvent.objects.filter(action="lease.update").count() == 2


def test_lending_changed_before_the_start_and_after_the_end(sent):
    make_host("gpu-a")
    mine, other = roomy_project(), roomy_project()
    lease = reserve(mine, 8, hour(1), hour(2), lend_idle=False)
    # Before its start it only says what the lease will do; the same value records nothing.
    services.lease_update(lease=lease, lend_idle=False)
    assert not AuditEvent.objects.filter(action="lease.update").exists()
    services.lease_update(lease=lease, lend_idle=True)
    lease = _active(fresh_lease(lease))
    assert lease.lend_idle
    borrower = make_vm(other, template=make_template(gpus=8), priority=Priority.SPOT)
    assert Device.objects.filter(vm=borrower, lease=lease).count() == 8

    assert services.leases_tick(now=lease.ends_at)["ended"] == 1
    with pytest.raises(Conflict) as refused:
        services.lease_update(lease=lease, lend_idle=False)
    assert refused.value.code == "lease_ended"
    assert refused.value.details == {"state": [LeaseState.ENDED]}
    assert fresh_lease(lease).lend_idle


def fresh_lease(lease: Lease) -> Lease:
    return Lease.objects.get(pk=lease.pk)


@pytest.mark.parametrize("state", [LeaseState.PREPARING, LeaseState.ACTIVE])
def test_the_claim_refuses_lease_gpus_that_are_not_lent_now(sent, state):
    host = make_host("gpu-a")
    mine, other = roomy_project(), roomy_project()
    lease = reserve(mine, 4, hour(1), hour(2), lend_idle=state != LeaseState.ACTIVE)
    assert services.leases_tick(now=lease.starts_at - LEAD)["prepared"] == 1
    if state == LeaseState.ACTIVE:  # active, but it does not lend
        assert services.leases_tick(now=lease.starts_at)["started"] == 1
    held = list(Device.objects.filter(lease=lease).order_by("pk"))
    vm = make_vm(other, template=make_template(gpus=8), priority=Priority.SPOT)
    assert vm.state == VmState.PENDING
    req = placement.request_for(vm)
    chosen = Placement(host.pk, host.name, held[0].numa_node, tuple(d.pk for d in held), "")
    with pytest.raises(ClaimConflict):
        placement.claim(fresh(vm), chosen, replace(req, gpus=4), borrow=True)
    assert not Device.objects.filter(lease=lease, vm__isnull=False).exists()


# --- PostgreSQL: borrowers and the lease's own VMs racing for the same GPUs ------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_borrowers_and_the_leases_own_vms_racing_never_share_a_gpu():
    make_host("gpu-a")
    make_host("gpu-b")  # 16 GPUs: the lease holds 8, the other 8 are free
    mine, others = roomy_project(), [roomy_project() for _ in range(4)]
    lease = _active(reserve(mine, 8, hour(1), hour(2)))
    two, image = make_template(gpus=2, eviction_notice_s=60), make_image()

    def create(index, *, in_lease=False):
        vm, _ = services.vm_create(
            project=mine if in_lease else others[index % 4],
            name=f"vm-{index}",
            template=two,
            image=image,
            priority=Priority.ON_DEMAND if in_lease else Priority.SPOT,
            lease=lease if in_lease else None,
        )
        return vm.state

    # Spot VMs fill the free GPUs first; then four more spot VMs, which can only borrow,
    # race four VMs of the lease for the lease's 8 GPUs.
    assert [create(n) for n in range(4)] == [VmState.PROVISIONING] * 4
    results, errors = _race(8, lambda index: create(4 + index, in_lease=index % 2 == 0))
    assert errors == []
    assert len(results) == 8 and set(results) <= {VmState.PROVISIONING, VmState.PENDING}
    placed = VirtualMachine.objects.filter(host__isnull=False)
    for vm in placed:  # no GPU given twice: each placed VM holds its own two
        assert Device.objects.filter(vm=vm).count() == 2
    assert Device.objects.filter(vm__isnull=False).count() == 2 * placed.count() <= 16
    # The lease's GPUs go to its own VMs or to borrowers, never to another on-demand VM.
    assert not Device.objects.filter(lease=lease, vm__priority=Priority.ON_DEMAND).exclude(
        vm__lease=lease
    )
    assert Device.objects.filter(lease=lease).count() == 8

    # The borrowers run; the lease's VMs still waiting evict them, with their full notice,
    # and take every one of the lease's GPUs at the hand-overs.
    for vm in placed.filter(priority=Priority.SPOT):
        report(fresh(vm), "running")
    services.vm_schedule_pending()
    evicting = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    for vm in evicting:
        assert vm.eviction_deadline == vm.eviction_notice_at + timedelta(seconds=60)
        assert Device.objects.filter(vm=vm, lease=lease).exists()  # only borrowers
        spot.evictions_reap(now=vm.eviction_deadline)
        report(fresh(vm), "shutoff")
    ours = VirtualMachine.objects.filter(lease=lease)
    assert [vm.state for vm in ours] == [VmState.PROVISIONING] * 4
    assert Device.objects.filter(vm__lease=lease, lease=lease).count() == 8
