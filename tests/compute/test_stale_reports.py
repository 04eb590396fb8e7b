"""Reports carry when they were taken, and the controller ignores what is older than the
last change of a VM or of a host's network state (issue 13, fault 6)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from compute import services
from compute.choices import VmState
from compute.models import Device, VirtualMachine
from compute.services.lifecycle import current_operation
from controlplane.models import AuditEvent
from network.models import HostNetwork
from tests.compute.test_vms import fresh
from tests.factories import enroll_network, make_host, make_template, make_vm

pytestmark = pytest.mark.django_db


def _running(vm):
    services.vm_observed(
        host=vm.host.name,
        payload={
            "vm_id": str(vm.pk),
            "generation": vm.generation,
            "power": "running",
            "ok": True,
            "operation_id": current_operation(vm),
        },
        sent_at=timezone.now(),
    )
    return fresh(vm)


def test_a_report_taken_before_the_delete_neither_finishes_it_nor_frees_the_gpus(project, sent):
    host = make_host()
    vm = _running(make_vm(project, template=make_template(gpus=2)))
    taken_before = timezone.now()
    vm, _ = services.vm_delete(vm=fresh(vm))
    # A report taken before the delete, which saw no guest (say, not yet built), arrives now.
    done = services.guests_reported(host=host.name, payload={"guests": []}, sent_at=taken_before)
    assert done["settled"] == []
    vm = fresh(vm)
    assert vm.state == VmState.DELETING
    assert Device.objects.filter(vm=vm).count() == 2
    # A report taken after the delete that sees no guest finishes it.
    done = services.guests_reported(host=host.name, payload={"guests": []}, sent_at=timezone.now())
    assert done["settled"] == [str(vm.pk)]
    assert fresh(vm).state == VmState.DELETED
    assert Device.objects.filter(vm=vm).count() == 0


def test_a_report_from_the_backlog_sends_no_work_again(project, sent, settings):
    settings.RECONCILE_GRACE_S = 0
    host = make_host()
    vm = _running(make_vm(project))
    taken_before = timezone.now() - timedelta(seconds=30)
    VirtualMachine.objects.filter(pk=vm.pk).update(
        updated_at=timezone.now() - timedelta(seconds=10)
    )
    before = len(sent)
    done = services.guests_reported(host=host.name, payload={"guests": []}, sent_at=taken_before)
    assert done["reissued"] == []
    assert len(sent) == before
    # A fresh report of the same drift does send the work again.
    done = services.guests_reported(host=host.name, payload={"guests": []}, sent_at=timezone.now())
    assert done["reissued"] == [str(vm.pk)]


def test_a_network_report_taken_before_the_last_change_sends_nothing_again(sent):
    host = make_host()
    enroll_network(host, "10.250.0.9")
    row = HostNetwork.objects.get(host=host)
    taken_before = timezone.now() - timedelta(seconds=5)
    HostNetwork.objects.filter(pk=row.pk).update(
        desired_generation=row.desired_generation + 1,
        desired_at=timezone.now(),
        reported_at=taken_before - timedelta(seconds=5),
    )
    before = len(sent)
    enroll_network(host, "10.250.0.9", sent_at=taken_before, applied_generation=0)
    assert len(sent) == before
    # A report older than the one recorded changes nothing at all.
    enroll_network(host, "10.250.0.9", sent_at=taken_before - timedelta(seconds=60))
    assert HostNetwork.objects.get(pk=row.pk).reported_at == taken_before
    # A fresh report that is behind gets the desired state again.
    enroll_network(host, "10.250.0.9", sent_at=timezone.now(), applied_generation=0)
    assert len(sent) == before + 1


def test_a_report_taken_before_the_start_does_not_stop_the_vm_its_running_report_moved(
    project, sent
):
    """The agent defines a guest, then starts it; a guests report taken between the two
    (the guest shut off) reaches the controller after the running report: it stops nothing.
    A report taken after the start that finds the guest off does (it powered itself off)."""
    host = make_host()
    vm = make_vm(project, template=make_template(gpus=1))
    wire = {"vm_id": str(vm.pk), "generation": vm.generation}
    taken_before = timezone.now()
    vm = _running(vm)
    assert vm.state == VmState.RUNNING
    off = {"guests": [{**wire, "power": "shutoff"}]}
    done = services.guests_reported(host=host.name, payload=off, sent_at=taken_before)
    assert done["settled"] == []
    vm = fresh(vm)
    assert (vm.state, vm.power_state, vm.state_reason) == (VmState.RUNNING, "running", "")
    done = services.guests_reported(host=host.name, payload=off, sent_at=timezone.now())
    assert done["settled"] == [str(vm.pk)]
    vm = fresh(vm)
    assert (vm.state, vm.state_reason) == (VmState.STOPPED, "the guest was found shutoff")


def test_a_report_of_an_older_generation_redelivered_late_changes_nothing(project, sent):
    """Reports are delivered at least once: the stop's report, delivered again after the
    start's (or handled after it by another controller thread), leaves the running VM's
    state and power as the newer report set them."""
    host = make_host()
    vm = _running(make_vm(project, template=make_template(gpus=1)))

    def report(vm, power):
        payload = {"vm_id": str(vm.pk), "generation": vm.generation, "power": power, "ok": True}
        payload["operation_id"] = current_operation(vm)
        return payload

    vm, _ = services.vm_stop(vm=vm)
    stopped = report(vm, "shutoff")
    services.vm_observed(host=host.name, payload=stopped, sent_at=timezone.now())
    assert fresh(vm).state == VmState.STOPPED
    vm, _ = services.vm_start(vm=fresh(vm))
    vm = _running(fresh(vm))
    assert (vm.state, vm.power_state, vm.applied_generation) == (
        VmState.RUNNING,
        "running",
        vm.generation,
    )
    services.vm_observed(host=host.name, payload=stopped, sent_at=timezone.now())
    after = fresh(vm)
    assert (after.state, after.power_state) == (VmState.RUNNING, "running")
    assert (after.updated_at, after.power_observed_at) == (vm.updated_at, vm.power_observed_at)


def test_a_failed_stop_reported_again_after_a_later_stop_leaves_the_vms_reason(project, sent):
    """A host's failure at an older generation, delivered again after a newer report, is
    recorded, but the VM keeps the newer report's state and reason."""
    host = make_host()
    vm = _running(make_vm(project))
    vm, _ = services.vm_stop(vm=vm)
    failed = {"vm_id": str(vm.pk), "generation": vm.generation, "ok": False}
    failed |= {"error": "virDomainShutdown: timed out", "operation_id": current_operation(vm)}
    services.vm_observed(host=host.name, payload=failed, sent_at=timezone.now())
    vm = fresh(vm)
    assert (vm.state, vm.task_state) == (VmState.RUNNING, "")
    assert vm.state_reason == "virDomainShutdown: timed out"
    vm, _ = services.vm_stop(vm=vm)
    stopped = {"vm_id": str(vm.pk), "generation": vm.generation, "power": "shutoff", "ok": True}
    stopped["operation_id"] = current_operation(vm)
    services.vm_observed(host=host.name, payload=stopped, sent_at=timezone.now())
    vm = fresh(vm)
    assert (vm.state, vm.state_reason) == (VmState.STOPPED, "")
    errors = AuditEvent.objects.filter(action="vm.host_error", object_id=str(vm.pk))
    assert errors.count() == 1
    services.vm_observed(host=host.name, payload=failed, sent_at=timezone.now())
    after = fresh(vm)
    assert (after.state, after.task_state, after.state_reason) == (VmState.STOPPED, "", "")
    assert after.updated_at == vm.updated_at
    assert errors.count() == 2  # the failure it reports is recorded, as every one is
