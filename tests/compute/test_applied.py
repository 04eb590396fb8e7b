"""A redelivered old ``vm_apply`` never resurrects a deleted VM (issue 13, fault 2): the agent
keeps a tombstone of the last generation per VM, removals included, on disk; messages carry
an expiry; and a guest reported for a deleted VM is destroyed at once by the reconcile.

On libvirt's test driver, through the real host task (``vm_apply``) and ``apply``."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from compute import host_tasks, services
from compute.choices import VmState
from compute.drivers.applied import KEEP_TOMBSTONES_S, AppliedStore
from compute.drivers.base import GuestNotFound
from compute.models import OrphanGuest
from compute.protocol import ABSENT, VmApply
from compute.services.lifecycle import current_operation
from controlplane.agent import reports, runtime
from controlplane.agent.config import AgentConfig
from tests.compute.test_host_tasks import VM, message
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_template, make_vm


@pytest.fixture(autouse=True)
def agent_config(tmp_path):
    runtime.configure(AgentConfig.from_env(host="gpu-01", instances_dir=tmp_path / "instances"))
    yield
    runtime.configure(None)


@pytest.fixture
def hv(tmp_path):
    from compute.drivers import simnode
    from compute.drivers.libvirt import LibvirtDriver

    fleet = simnode.write_fleet(tmp_path / "fleet", 1, 0)
    driver = LibvirtDriver(f"test://{fleet['gpu-01']}", poll_interval_s=0.001)
    yield driver
    driver.close()


@pytest.fixture
def agent(hv, monkeypatch):
    """The real ``vm_apply`` task on ``hv``; what it reports is collected."""
    said = []
    monkeypatch.setattr(runtime, "_hypervisor", hv)
    monkeypatch.setattr(
        reports, "send", lambda host, kind, payload, **kw: said.append((kind, payload))
    )
    return said


def _gone(hv):
    with pytest.raises(GuestNotFound):
        hv.get_guest(VM)
    return True


def test_an_old_apply_replayed_after_the_delete_does_not_bring_the_guest_back(hv, agent):
    create = message(generation=2)
    host_tasks.vm_apply(**create.to_wire())
    assert agent[-1][1]["power"] == "running"
    host_tasks.vm_apply(**VmApply(vm_id=VM, generation=3, desired=ABSENT).to_wire())
    assert agent[-1][1]["power"] == ABSENT and _gone(hv)
    # The broker redelivers the create (visibility timeout, agent killed with it prefetched).
    host_tasks.vm_apply(**create.to_wire())
    assert _gone(hv)
    assert agent[-1][1] == {**agent[-1][1], "generation": 3, "power": ABSENT}
    # Nor does a stop or any other generation up to the removal.
    host_tasks.vm_apply(**message(generation=3, desired="stopped").to_wire())
    assert _gone(hv)


def test_the_tombstone_survives_an_agent_restart(hv, tmp_path):
    host_tasks.apply(message(generation=1), hv)
    host_tasks.apply(VmApply(vm_id=VM, generation=2, desired=ABSENT), hv)
    # A new process: a new store on the same folder.
    store = AppliedStore(runtime.config().applied_dir)
    assert store.get(VM).absent and store.get(VM).generation == 2
    assert host_tasks.apply(message(generation=1), hv, store) == (2, ABSENT)
    assert _gone(hv)


def test_a_newer_generation_after_a_removal_is_applied(hv):
    # An evicted spot VM started again on the same host gets a later generation.
    host_tasks.apply(message(generation=1), hv)
    host_tasks.apply(VmApply(vm_id=VM, generation=2, desired=ABSENT), hv)
    assert host_tasks.apply(message(generation=3), hv) == (3, "running")


def test_an_expired_message_is_not_applied_but_a_removal_always_is(hv):
    expired = message(generation=1, expires_at=time.time() - 1)
    assert host_tasks.apply(expired, hv) == (1, ABSENT)
    assert _gone(hv)
    host_tasks.apply(message(generation=1, expires_at=time.time() + 60), hv)
    assert hv.get_guest(VM).generation == 1
    removal = VmApply(vm_id=VM, generation=2, desired=ABSENT, expires_at=time.time() - 1)
    assert host_tasks.apply(removal, hv) == (2, ABSENT)
    assert _gone(hv)


def test_tombstones_are_pruned_after_their_keep(tmp_path):
    store = AppliedStore(tmp_path / "applied")
    store.record(VM, 4, absent=True)
    assert store.prune(now=time.time() + 60) == 0
    assert store.prune(now=time.time() + KEEP_TOMBSTONES_S + 60) == 1
    assert store.get(VM) is None


def test_a_record_never_goes_back(tmp_path):
    store = AppliedStore(tmp_path / "applied")
    store.record(VM, 5, absent=False)
    store.record(VM, 3, absent=True)
    assert (store.get(VM).generation, store.get(VM).absent) == (5, False)


@pytest.mark.django_db
def test_controller_messages_expire(project, sent, settings):
    settings.VM_APPLY_TTL_S = 120
    make_host()
    vm = make_vm(project)
    wire = sent[-1][2]
    assert time.time() + 100 < wire["expires_at"] <= time.time() + 120
    services.vm_delete(vm=fresh(vm))
    assert sent[-1][2]["desired"] == "absent" and sent[-1][2]["expires_at"] == 0


@pytest.mark.django_db
def test_a_guest_reported_for_a_deleted_vm_is_destroyed_at_once(project, sent, settings):
    settings.ORPHAN_GRACE_S = 300
    host = make_host()
    vm = make_vm(project, template=make_template(gpus=1))
    services.vm_observed(
        host=host.name,
        payload={
            "vm_id": str(vm.pk),
            "generation": vm.generation,
            "power": "running",
            "ok": True,
            "operation_id": current_operation(vm),
        },
        sent_at=timezone.now(),
    )
    vm, _ = services.vm_delete(vm=fresh(vm))
    services.guests_reported(host=host.name, payload={"guests": []}, sent_at=timezone.now())
    vm = fresh(vm)
    assert vm.state == VmState.DELETED
    # The old create is redelivered to an agent without tombstones: the guest is back.
    later = timezone.now() + timedelta(seconds=1)
    guest = {"vm_id": str(vm.pk), "generation": vm.generation - 1, "power": "running"}
    done = services.guests_reported(host=host.name, payload={"guests": [guest]}, sent_at=later)
    assert done["orphans_destroyed"] == [str(vm.pk)]
    destroy = sent[-1][2]
    assert destroy["vm_id"] == str(vm.pk) and destroy["desired"] == "absent"
    assert destroy["generation"] > vm.generation


@pytest.mark.django_db
def test_a_report_taken_before_a_vms_deletion_ended_makes_no_orphan(project, sent):
    host = make_host()
    vm = make_vm(project, template=make_template(gpus=1))
    report(fresh(vm), "running")
    guest = {"vm_id": str(vm.pk), "generation": fresh(vm).generation, "power": "running"}
    taken = timezone.now()
    vm, _ = services.vm_delete(vm=fresh(vm))
    report(fresh(vm), "absent")  # the agent's answer to the delete ends it
    assert fresh(vm).state == VmState.DELETED
    # The guests report taken before that answer arrives after it (the broker held it
    # back): the guest it saw is the one the deletion took away.
    done = services.guests_reported(host=host.name, payload={"guests": [guest]}, sent_at=taken)
    assert done["orphans_destroyed"] == []
    assert not OrphanGuest.objects.filter(vm_id=str(vm.pk)).exists()
