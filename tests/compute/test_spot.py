"""Spot preemption in the services: notices given to the minimal victim set (never an
on-demand VM, never a guaranteed minimum), the deadline honoured or cut short by the guest,
the hand-over only after the host reported the victims off, and evicted VMs restarting."""

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from compute import services
from compute.choices import Priority, VmState, VmTask
from compute.models import Device, VirtualMachine
from compute.selectors import gpu_allocation_errors, host_usage_drift
from compute.services import spot
from controlplane.errors import Conflict, QuotaExceeded
from controlplane.models import AuditEvent, Event
from tenants import services as tenants
from tenants.choices import Role
from tests.compute.test_vms import fresh, report
from tests.factories import add_member, make_host, make_image, make_project, make_template, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture
def roomy():
    def make(project):
        tenants.quota_set(project=project, vcpus=4096, memory_gib=16384, gpus=256, vms=256)
        return project

    return make


@pytest.fixture
def world(roomy, sent):
    """Two 8-GPU hosts full of running spot VMs of two projects: host A eight 1-GPU VMs,
    host B two 4-GPU VMs (B's are younger); and a project wanting on-demand GPUs."""
    a, b = make_host("gpu-a"), make_host("gpu-b")
    spotters, other, wants = (roomy(make_project()) for _ in range(3))
    image = make_image()
    t1, t4, t8 = (make_template(gpus=n, eviction_notice_s=30) for n in (1, 4, 8))
    small = [make_vm(spotters, template=t1, image=image, priority=Priority.SPOT) for _ in range(8)]
    big = [make_vm(other, template=t4, image=image, priority=Priority.SPOT) for _ in range(2)]
    for vm in small + big:
        report(fresh(vm), "running")
    # The small ones pack onto one host, the big ones fill the other.
    if fresh(small[0]).host_id != a.pk:
        a, b = b, a
    assert {fresh(vm).host_id for vm in small} == {a.pk}
    assert {fresh(vm).host_id for vm in big} == {b.pk}
    return {"a": a, "b": b, "small": small, "big": big, "wants": wants, "t1": t1, "t8": t8,
            "t4": t4, "image": image, "spotters": spotters, "other": other}  # fmt: skip


def _on_demand(world, template, name="urgent"):
    return make_vm(world["wants"], template=template, image=world["image"], name=name)


def _stop_reported(vm):
    vm = fresh(vm)
    assert vm.task_state == VmTask.STOPPING
    return report(vm, "shutoff")


def test_an_8_gpu_request_notices_the_fewest_spot_vms(world, sent):
    before = timezone.now()
    vm = _on_demand(world, world["t8"])
    assert vm.state == VmState.PENDING and vm.reserved_host_id == world["b"].pk
    victims = VirtualMachine.objects.filter(state=VmState.EVICTING)
    assert {v.pk for v in victims} == {v.pk for v in world["big"]}
    for victim in victims:
        assert victim.task_state == VmTask.NONE  # still running out its notice
        assert victim.evicted_for_id == vm.pk
        assert before + timedelta(seconds=29) < victim.eviction_deadline
        assert victim.eviction_deadline <= timezone.now() + timedelta(seconds=30)
    # Host A's small VMs are untouched, and nothing was stopped yet.
    assert not VirtualMachine.objects.filter(
        pk__in=[v.pk for v in world["small"]], state=VmState.EVICTING
    ).exists()
    notices = Event.objects.filter(kind="vm.eviction_notice", project=world["other"])
    assert notices.count() == 2 and notices.first().payload["action"] == "stop"
    waiting = Event.objects.get(kind="vm.preempting", project=world["wants"])
    assert waiting.payload["victims"] == 2  # how many, not whose
    assert AuditEvent.objects.filter(action="vm.eviction_notice").count() == 2


def test_never_an_on_demand_vm(world, sent):
    # Make host B's VMs on-demand-like: a 4-GPU on-demand VM on host A's cell... simpler:
    # delete B's spot VMs and put an on-demand 4-GPU VM there; an 8-GPU request then finds
    # no host it could empty of spot VMs alone.
    for vm in world["big"]:
        services.vm_delete(vm=fresh(vm))
        report(fresh(vm), "absent")
    keeper = _on_demand(world, world["t4"], name="keeper")
    report(fresh(keeper), "running")
    assert fresh(keeper).host_id == world["b"].pk
    vm = _on_demand(world, world["t8"])
    # Only host A can be emptied: all eight 1-GPU spot VMs go, the on-demand one stays.
    evicting = set(
        VirtualMachine.objects.filter(state=VmState.EVICTING).values_list("pk", flat=True)
    )
    assert evicting == {v.pk for v in world["small"]}
    assert fresh(keeper).state == VmState.RUNNING
    assert vm.reserved_host_id == world["a"].pk


def test_the_deadline_is_honoured_then_the_hand_over_places_the_waiter(world, sent):
    vm = _on_demand(world, world["t8"])
    victims = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    # Before the deadline the reaper stops nothing.
    assert services.evictions_reap() == 0
    assert all(fresh(v).task_state == VmTask.NONE for v in victims)
    later = timezone.now() + timedelta(seconds=31)
    assert services.evictions_reap(now=later) == 2
    stop = [m for q, t, m in sent if m["vm_id"] == str(victims[0].pk)][-1]
    assert stop["desired"] == "stopped" and stop["graceful_timeout_s"] == 10
    # One victim reported off: the other still holds its GPUs, the waiter waits.
    _stop_reported(victims[0])
    assert fresh(victims[0]).state == VmState.EVICTING
    assert fresh(vm).state == VmState.PENDING
    assert Device.objects.filter(vm_id=victims[0].pk).count() == 4
    # The second: both are evicted, their GPUs go to the waiter in the same transaction.
    _stop_reported(victims[1])
    for victim in victims:
        victim = fresh(victim)
        assert victim.state == VmState.EVICTED and victim.host_id is None
        assert victim.evicted_at is not None and victim.evicted_host_id == world["b"].pk
        assert not Device.objects.filter(vm_id=victim.pk).exists()
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING and vm.host_id == world["b"].pk
    assert Device.objects.filter(vm=vm).count() == 8 and vm.reserved_host_id is None
    assert host_usage_drift() == [] and gpu_allocation_errors() == []
    assert Event.objects.filter(kind="vm.evicted").count() == 2
    sent_to_waiter = [m for q, t, m in sent if m["vm_id"] == str(vm.pk)]
    assert sent_to_waiter[-1]["desired"] == "running" and len(sent_to_waiter[-1]["devices"]) == 8


def test_victims_deleted_during_their_notice_hand_the_room_over_at_once(world, sent):
    # Their jobs ended during the notice: their projects deleted them. The waiter takes the
    # room when the last of them is gone, not at the next periodic pass.
    vm = _on_demand(world, world["t8"])
    first, second = VirtualMachine.objects.filter(state=VmState.EVICTING).order_by("pk")
    services.vm_delete(vm=fresh(first))
    report(fresh(first), "absent")
    assert fresh(first).state == VmState.DELETED
    vm = fresh(vm)  # the other victim still holds its GPUs: the waiter waits
    assert vm.state == VmState.PENDING and vm.reserved_host_id == world["b"].pk
    services.vm_delete(vm=fresh(second))
    report(fresh(second), "absent")
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING and vm.host_id == world["b"].pk
    assert Device.objects.filter(vm=vm).count() == 8 and vm.reserved_host_id is None
    assert host_usage_drift() == [] and gpu_allocation_errors() == []
    assert [m for q, t, m in sent if m["vm_id"] == str(vm.pk)][-1]["desired"] == "running"


def test_the_hand_over_waits_for_a_victim_deleted_during_its_notice(world, sent):
    # One victim's project deletes it during the notice; the other is stopped at the
    # deadline and reported off first. The deleted one still holds its GPUs until its
    # guest is gone: the waiter is placed then, not before (there would be no room).
    vm = _on_demand(world, world["t8"])
    deleted, stopped = VirtualMachine.objects.filter(state=VmState.EVICTING).order_by("pk")
    services.vm_delete(vm=fresh(deleted))
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    _stop_reported(stopped)
    assert fresh(stopped).state == VmState.EVICTING  # its hand-over waits for the other
    vm = fresh(vm)
    assert vm.state == VmState.PENDING and vm.reserved_host_id == world["b"].pk
    report(fresh(deleted), "absent")
    assert fresh(deleted).state == VmState.DELETED
    assert fresh(stopped).state == VmState.EVICTED
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING and vm.host_id == world["b"].pk
    assert host_usage_drift() == [] and gpu_allocation_errors() == []


def test_the_free_part_of_a_handed_over_host_waits_for_the_waiter(world, sent):
    # Host B: one 4-GPU spot VM and 4 free GPUs. An 8-GPU request evicts that VM and counts
    # on the 4 free ones; a spot request meanwhile must not take them.
    gone, victim = world["big"]
    services.vm_delete(vm=fresh(gone))
    report(fresh(gone), "absent")
    vm = _on_demand(world, world["t8"])
    assert vm.reserved_host_id == world["b"].pk
    assert set(VirtualMachine.objects.filter(state=VmState.EVICTING)) == {victim}
    late = make_vm(world["spotters"], template=world["t1"], image=world["image"], priority="spot")
    assert fresh(late).state == VmState.PENDING  # host A is full, host B is being handed over
    assert services.vm_schedule_pending() == 0
    assert Device.objects.filter(host=world["b"], kind="gpu", vm__isnull=True).count() == 4
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    _stop_reported(victim)
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING and vm.host_id == world["b"].pk
    assert Device.objects.filter(vm=vm).count() == 8
    assert fresh(late).state == VmState.PENDING and fresh(late).host_id is None
    assert host_usage_drift() == [] and gpu_allocation_errors() == []


def test_the_guest_cuts_the_notice_short(world, sent):
    _on_demand(world, world["t8"])
    victim = VirtualMachine.objects.filter(state=VmState.EVICTING).first()
    spot.eviction_acknowledge(vm=victim)
    victim = fresh(victim)
    assert victim.task_state == VmTask.STOPPING and victim.eviction_acknowledged_at is not None
    assert victim.eviction_deadline <= timezone.now()
    spot.eviction_acknowledge(vm=victim)  # repeated: nothing more
    assert fresh(victim).generation == victim.generation


def test_a_stopped_spot_vm_is_evicted_without_notice(world, sent):
    for vm in world["big"]:
        services.vm_stop(vm=fresh(vm))
        report(fresh(vm), "shutoff")
    _on_demand(world, world["t8"])
    for victim in VirtualMachine.objects.filter(state=VmState.EVICTING):
        assert victim.task_state == VmTask.STOPPING
        assert victim.eviction_deadline <= timezone.now()


@pytest.mark.parametrize("saved", [None, 0, 1])
def test_of_equally_few_victims_the_one_that_would_lose_the_least_work_goes(world, sent, saved):
    # One of host B's two 4-GPU VMs makes room for a 4-GPU request. An eviction loses the
    # work since the VM's start or its guest's last reported checkpoint: without a report
    # the one started last goes; a checkpoint just reported makes that VM the one.
    big = world["big"]
    assert fresh(big[0]).running_since < fresh(big[1]).running_since
    if saved is not None:
        spot.checkpoint_report(vm=fresh(big[saved]))
    vm = _on_demand(world, world["t4"])
    assert vm.reserved_host_id == world["b"].pk
    evicting = set(
        VirtualMachine.objects.filter(state=VmState.EVICTING).values_list("pk", flat=True)
    )
    assert evicting == {big[1 if saved is None else saved].pk}


@pytest.mark.parametrize(
    "stretch_s, due_in_s, goes, notice_s",
    [
        (0, 10, 0, 30),
        (0, 27, 1, 30),
        (0, 40, 1, 30),
        (45, 10, 0, 30),
        (45, 27, 0, 32),  # the notice waits for the save, and its margin
        (45, 70, 0, 75),
        (45, 71, 1, 30),  # beyond the stretch: the one that just saved goes
    ],
)
def test_a_guest_expected_to_save_during_its_notice_goes_first(
    world, sent, settings, stretch_s, due_in_s, goes, notice_s
):
    # Host B's first guest saves every 30 minutes (its first report, 1,800 s after its
    # start, says so) and is due to save again in ``due_in_s``; the second has just saved.
    # Within the 30 s notice, less its 5 s margin, or within ``KUMO_SPOT_NOTICE_STRETCH_S``
    # more, the first loses only what follows its save: it goes, and its notice lasts until
    # the save and the margin. Later, the one that just saved loses least.
    settings.SPOT_NOTICE_STRETCH_S = stretch_s
    big = world["big"]
    now = timezone.now()
    long_ago = now - timedelta(days=1)
    VirtualMachine.objects.filter(pk__in=[v.pk for v in big]).update(created_at=long_ago)
    VirtualMachine.objects.filter(pk=big[0].pk).update(running_since=now - timedelta(seconds=1800))
    spot.checkpoint_report(vm=fresh(big[0]))
    assert fresh(big[0]).checkpoint_interval_s == pytest.approx(1800, abs=1)
    back = timedelta(seconds=1800 - due_in_s)
    VirtualMachine.objects.filter(pk=big[0].pk).update(
        running_since=now - timedelta(seconds=1800) - back, checkpointed_at=now - back
    )
    spot.checkpoint_report(vm=fresh(big[1]))
    vm = _on_demand(world, world["t4"])
    (victim,) = VirtualMachine.objects.filter(state=VmState.EVICTING)
    assert victim.pk == big[goes].pk
    notice = (victim.eviction_deadline - victim.eviction_notice_at).total_seconds()
    assert notice == pytest.approx(notice_s, abs=1)
    assert victim.eviction_deadline.isoformat() in vm.state_reason


def test_a_checkpoint_report_keeps_the_interval_since_the_save_before_or_the_start(world):
    vm = world["big"][0]
    ago = lambda s: timezone.now() - timedelta(seconds=s)  # noqa: E731
    VirtualMachine.objects.filter(pk=vm.pk).update(created_at=ago(86400), running_since=ago(600))
    spot.checkpoint_report(vm=fresh(vm))  # the first save since its start
    assert fresh(vm).checkpoint_interval_s == pytest.approx(600, abs=1)
    VirtualMachine.objects.filter(pk=vm.pk).update(checkpointed_at=ago(300))
    spot.checkpoint_report(vm=fresh(vm))  # since the save before
    assert fresh(vm).checkpoint_interval_s == pytest.approx(300, abs=1)
    # Started again since its last save: the guest counts from its start.
    VirtualMachine.objects.filter(pk=vm.pk).update(checkpointed_at=ago(300), running_since=ago(60))
    spot.checkpoint_report(vm=fresh(vm))
    assert fresh(vm).checkpoint_interval_s == pytest.approx(60, abs=1)


def test_a_restart_counts_in_what_an_eviction_would_lose(world, sent):
    # Host B's first VM, stopped and started again after the second started: its work is
    # unsaved since that start, for less time, so it goes, though it was created first.
    old, young = world["big"]
    services.vm_stop(vm=fresh(old))
    report(fresh(old), "shutoff")
    services.vm_start(vm=fresh(old))
    report(fresh(old), "running")
    assert fresh(old).running_since > fresh(young).running_since
    assert fresh(old).launched_at < fresh(young).launched_at  # still the first launched
    _on_demand(world, world["t4"])
    assert set(VirtualMachine.objects.filter(state=VmState.EVICTING)) == {fresh(old)}


def test_a_stopped_spot_vm_goes_before_a_running_one(world, sent):
    old, young = world["big"]
    spot.checkpoint_report(vm=fresh(young))  # of two running ones, this one would go
    services.vm_stop(vm=fresh(old))
    report(fresh(old), "shutoff")
    _on_demand(world, world["t4"])
    (victim,) = VirtualMachine.objects.filter(state=VmState.EVICTING)
    assert victim.pk == old.pk and victim.task_state == VmTask.STOPPING  # no notice to run


def test_a_guaranteed_minimum_is_never_a_victim(world, sent):
    # The other project's two 4-GPU spot VMs are within its minimum of 8: host A's eight
    # small VMs are evicted instead.
    services.guarantee_set(project=world["other"], min_gpus=8)
    _on_demand(world, world["t8"])
    evicting = set(
        VirtualMachine.objects.filter(state=VmState.EVICTING).values_list("pk", flat=True)
    )
    assert evicting == {v.pk for v in world["small"]}


def test_a_minimum_protects_only_what_is_within_it(world, sent):
    # A minimum of 4: one of the two 4-GPU VMs (the oldest) is protected; an 8-GPU request
    # must then empty host A.
    services.guarantee_set(project=world["other"], min_gpus=4)
    protected = spot.protected_spot_vms()
    assert protected == {world["big"][0].pk}
    vm = _on_demand(world, world["t8"])
    assert vm.reserved_host_id == world["a"].pk


def test_spot_requests_never_preempt(world, sent):
    vm = make_vm(world["wants"], template=world["t8"], image=world["image"], priority="spot")
    assert vm.state == VmState.PENDING and vm.reserved_host_id is None
    assert not VirtualMachine.objects.filter(state=VmState.EVICTING).exists()


def test_an_evicted_vm_starts_again_when_room_returns(world, sent):
    vm = _on_demand(world, world["t8"])
    victims = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    for victim in victims:
        _stop_reported(victim)
    evicted = fresh(victims[0])
    assert evicted.state == VmState.EVICTED
    # No room: it waits, pending.
    started, operation = services.vm_start(vm=evicted)
    assert started.state == VmState.PENDING and operation.kind == "vm.start"
    # Room returns (the on-demand VM is deleted): the periodic placement places it.
    services.vm_delete(vm=fresh(vm))
    report(fresh(vm), "absent")
    assert services.vm_schedule_pending() >= 1
    assert fresh(evicted).state == VmState.PROVISIONING


def test_restarting_an_evicted_vm_claims_its_quota_again(world, sent):
    _on_demand(world, world["t8"])
    victims = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    for victim in victims:
        _stop_reported(victim)
    tenants.quota_set(project=world["other"], gpus=0)
    with pytest.raises(QuotaExceeded):
        services.vm_start(vm=fresh(victims[0]))
    assert fresh(victims[0]).state == VmState.EVICTED


def test_evicting_vms_refuse_stop_and_start(world, sent):
    _on_demand(world, world["t8"])
    victim = VirtualMachine.objects.filter(state=VmState.EVICTING).first()
    with pytest.raises(Conflict):
        services.vm_stop(vm=fresh(victim))


def test_reaping_survives_a_restart_because_it_reads_the_database(world, sent):
    # The notice is in the database alone: a fresh process (no state) stops what is due.
    _on_demand(world, world["t8"])
    VirtualMachine.objects.filter(state=VmState.EVICTING).update(
        eviction_deadline=timezone.now() - timedelta(seconds=1)
    )
    assert services.evictions_reap() == 2


def test_a_running_report_during_the_notice_keeps_the_victim_evicting(world, sent):
    # The host redefines a victim at its notice's generation and reports it running: it
    # runs out its notice, still evicting (it used to go back to running, and the waiter
    # then waited for ever).
    vm = _on_demand(world, world["t8"])
    victims = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    for victim in victims:
        report(fresh(victim), "running")
        assert fresh(victim).state == VmState.EVICTING
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    for victim in victims:
        _stop_reported(victim)
    assert fresh(vm).state == VmState.PROVISIONING and fresh(vm).host_id == world["b"].pk


def test_the_guests_report_completes_the_hand_over(world, sent):
    # The answers to the stop were lost: the periodic guests report carries the same facts.
    vm = _on_demand(world, world["t8"])
    victims = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))
    guests = [
        {"vm_id": str(v.pk), "generation": fresh(v).generation, "power": "shutoff"} for v in victims
    ]
    done = services.guests_reported(
        host=world["b"].name, payload={"guests": guests}, sent_at=timezone.now()
    )
    assert set(done["settled"]) == {str(v.pk) for v in victims}
    assert all(fresh(v).state == VmState.EVICTED for v in victims)
    assert fresh(vm).state == VmState.PROVISIONING and fresh(vm).host_id == world["b"].pk
    assert host_usage_drift() == [] and gpu_allocation_errors() == []


def test_a_stale_index_makes_it_decide_again(world, sent):
    # The index read host B's VMs as evictable; one of them then changed without the index
    # seeing it (a late commit). The locked re-check refuses host B, its VMs are read
    # again, and the next decision empties host A instead.
    spot.index.sync()
    VirtualMachine.objects.filter(pk=world["big"][0].pk).update(
        task_state=VmTask.STOPPING, updated_at=timezone.now() - timedelta(hours=1)
    )
    vm = _on_demand(world, world["t8"])
    evicting = set(
        VirtualMachine.objects.filter(state=VmState.EVICTING).values_list("pk", flat=True)
    )
    assert evicting == {v.pk for v in world["small"]} and vm.reserved_host_id == world["a"].pk


B_ADDRESS = "203.0.113.77"
B_REQUEST = "b-request-4f1c"


def _everything(api, project, basename):
    url = reverse(f"api:{basename}-list", kwargs={"project_slug": project.slug})
    answer = api.get(url, {"page_size": 500})
    assert answer.status_code == 200
    return answer.json()["results"]


def test_a_preempted_project_finds_no_trace_of_the_project_that_preempted_it(
    world,
    client_for,
):
    a, b = world["other"], world["wants"]  # A holds the 4-GPU spot VMs an 8-GPU VM needs
    reader = add_member(a, role=Role.READER)
    created = client_for(b.owner).post(
        reverse("api:project-vm-list", kwargs={"project_slug": b.slug}),
        {"name": "b-urgent", "template": world["t8"].name, "image": world["image"].pk},
        format="json",
        REMOTE_ADDR=B_ADDRESS,
        HTTP_X_REQUEST_ID=B_REQUEST,
    )
    assert created.status_code == 202, created.json()
    b_vm = created.json()["id"]
    victims = list(VirtualMachine.objects.filter(state=VmState.EVICTING))
    assert {v.project_id for v in victims} == {a.pk}
    services.evictions_reap(now=timezone.now() + timedelta(seconds=31))  # notices end
    for victim in victims:  # the hand-over, as the host reports them off
        _stop_reported(victim)
    assert all(fresh(v).state == VmState.EVICTED for v in victims)

    api = client_for(reader)
    trail = _everything(api, a, "project-auditevent")
    notices = [r for r in trail if r["action"] == "vm.eviction_notice"]
    assert len(notices) == 2 and {r["actor"] for r in notices} == {"scheduler"}
    assert {r["ip_address"] for r in notices} == {None}
    seen = json.dumps([trail, _everything(api, a, "project-event")])
    for trace in (b.owner.username, B_ADDRESS, B_REQUEST, b_vm, b.slug, "b-urgent"):
        assert trace not in seen, f"A's trail names {trace!r} of project B"
    # B's own trail keeps its user and address, and says how many VMs it evicted, not whose.
    own = _everything(client_for(b.owner), b, "project-auditevent")
    (preempt,) = [r for r in own if r["action"] == "vm.preempt"]
    assert preempt["actor"] == b.owner.username and preempt["ip_address"] == B_ADDRESS
    assert preempt["detail"]["victims"] == 2 and preempt["detail"]["own_victims"] == []
    assert not any(str(v.pk) in json.dumps(own) for v in victims)


def test_a_small_on_demand_vm_joins_on_demand_work_so_a_spot_host_can_still_be_emptied(roomy, sent):
    # Seven 1-GPU spot VMs pack onto host A (one GPU left free there); a 2-GPU on-demand VM
    # takes host B. A 1-GPU on-demand VM goes to B, though A's free GPU is the tighter fit,
    # so that an 8-GPU on-demand VM can still have A by evicting its spot VMs.
    make_host("gpu-a"), make_host("gpu-b")
    spotters, wants = roomy(make_project()), roomy(make_project())
    image = make_image()
    t1, t2, t8 = (make_template(gpus=n, eviction_notice_s=30) for n in (1, 2, 8))
    spots = [make_vm(spotters, template=t1, image=image, priority=Priority.SPOT) for _ in range(7)]
    for vm in spots:
        report(fresh(vm), "running")
    a = fresh(spots[0]).host
    assert {fresh(vm).host_id for vm in spots} == {a.pk}
    pinning = make_vm(wants, template=t2, image=image)
    b = fresh(pinning).host
    assert b.pk != a.pk
    small = make_vm(wants, template=t1, image=image)
    assert fresh(small).host_id == b.pk
    whole = make_vm(wants, template=t8, image=image)
    assert whole.state == VmState.PENDING and whole.reserved_host_id == a.pk
    assert {vm.pk for vm in VirtualMachine.objects.filter(state=VmState.EVICTING)} == {
        vm.pk for vm in spots
    }
