"""Consoles and rescue through the API, on the fake hypervisor: the console log (the agent's
task answering through the operation result path), hard reset and immediate power-off
with their 409s, their audit events and what the host is asked to do."""

import pytest
from django.test import override_settings
from django.utils import timezone

from compute import host_tasks
from compute.choices import VmState, VmTask
from compute.drivers.base import GuestSpec, PowerState
from compute.drivers.fake import FakeDriver
from compute.models import Host, VirtualMachine
from compute.protocol import VmApply
from compute.services import lifecycle as vm_services
from controlplane import tasks as control_tasks
from controlplane.agent import reports, runtime
from controlplane.agent.config import AgentConfig
from controlplane.models import AuditEvent
from tenants import services as tenants
from tenants.choices import Role
from tests.factories import add_member, make_host, make_template, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client_for, project):
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    return client_for(project.owner)


def _vm(project, state, name=None):
    """A VM placed on host cpu-07 and settled in ``state``."""
    if not Host.objects.filter(name="cpu-07").exists():
        make_host("cpu-07", kind="cpu")
    vm = make_vm(project, **({"name": name} if name else {}))
    VirtualMachine.objects.filter(pk=vm.pk).update(state=state, task_state=VmTask.NONE)
    vm = VirtualMachine.objects.get(pk=vm.pk)
    assert vm.host is not None
    return vm


@pytest.fixture
def running_vm(api, project):
    return _vm(project, VmState.RUNNING)


def url(project, vm, suffix):
    return f"/api/v1/projects/{project.slug}/vms/{vm.pk}/{suffix}"


@pytest.fixture
def agent(monkeypatch, tmp_path):
    """A host agent answering at once: a host task sent to the VM's host runs here on a
    fake hypervisor, and its report goes straight to the controller's handler."""
    runtime.configure(AgentConfig.from_env(host="cpu-07", instances_dir=tmp_path))
    fake = FakeDriver()
    monkeypatch.setattr(host_tasks, "driver", lambda: fake)

    def report(host, kind, payload):
        assert kind == "operation.result"
        control_tasks._operation_result(host=host, payload=payload, sent_at=timezone.now())

    monkeypatch.setattr(reports, "send", report)

    def send_to_host(host, task, **kwargs):
        assert task == host_tasks.VM_CONSOLE_LOG_TASK
        host_tasks.vm_console_log(**kwargs)

    monkeypatch.setattr(vm_services.agents, "send_to_host", send_to_host)
    yield fake
    runtime.configure(None)


def _guest(fake, vm):
    fake.ensure_defined(GuestSpec(vm_id=str(vm.pk), generation=1, name="g", vcpus=1, memory_mib=64))
    fake.ensure_running(str(vm.pk))


def test_the_console_log_is_the_tail_of_what_the_guest_printed(api, project, running_vm, agent):
    _guest(agent, running_vm)
    agent.write_console(str(running_vm.pk), b"x" * 70000 + b"\nlogin: \xff\nkumo-vm login: ")
    answer = api.get(url(project, running_vm, "console-log/"))
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["bytes"] == 65536 and body["output"].endswith("kumo-vm login: ")
    assert "\ufffd" in body["output"]  # a byte that is not UTF-8 is replaced, not a 500
    last = api.get(url(project, running_vm, "console-log/?lines=2")).json()
    assert last["output"] == "login: \ufffd\nkumo-vm login: "
    few = api.get(url(project, running_vm, "console-log/?bytes=15")).json()
    assert few == {"output": "kumo-vm login: ", "bytes": 15}
    bad = api.get(url(project, running_vm, "console-log/?bytes=0"))
    assert bad.status_code == 400 and "bytes" in bad.json()["details"]


@override_settings(CONSOLE_LOG_WAIT_S=0.1)
def test_a_host_that_does_not_answer_in_time_gives_the_operation_to_poll(api, project, running_vm):
    answer = api.get(url(project, running_vm, "console-log/"))
    assert answer.status_code == 202 and answer.json()["kind"] == "vm.console_log"
    assert "Location" in answer.headers


def test_console_log_needs_a_placed_vm_and_a_member(client_for, api, project):
    pending = make_vm(project, template=make_template(gpus=8))  # no host has room
    answer = api.get(url(project, pending, "console-log/"))
    assert answer.status_code == 409 and answer.json()["details"]["state"] == ["pending"]
    reader = client_for(add_member(project, role=Role.READER))
    assert reader.get(url(project, pending, "console-log/")).status_code == 403
    assert reader.post(url(project, pending, "reset/")).status_code == 403


@pytest.mark.parametrize(
    "action, task, service",
    [("reset", VmTask.RESETTING, "reset"), ("power-off", VmTask.POWERING_OFF, "power_off")],
)
def test_reset_and_power_off_are_202_on_a_running_vm_and_409_otherwise(
    api, project, running_vm, action, task, service
):
    stopped = _vm(project, VmState.STOPPED, name="off")
    refused = api.post(url(project, stopped, f"{action}/"))
    assert refused.status_code == 409 and refused.json()["details"]["state"] == ["stopped"]

    answer = api.post(url(project, running_vm, f"{action}/"))
    assert answer.status_code == 202 and answer.json()["kind"] == f"vm.{service}"
    vm = VirtualMachine.objects.get(pk=running_vm.pk)
    assert vm.task_state == task
    assert AuditEvent.objects.filter(action=f"vm.{service}", object_id=str(vm.pk)).exists()
    message = vm_services.apply_message(vm)
    if action == "reset":
        assert message.desired == "running" and message.reset and not message.reboot
    else:
        assert message.desired == "stopped" and message.graceful_timeout_s == 0
    # One action in flight: a second reset or power-off of the same VM now is a 409.
    again = api.post(url(project, running_vm, "reset/"))
    assert again.status_code == 409


def test_power_off_overrules_a_hanging_graceful_stop(api, project, running_vm):
    assert api.post(url(project, running_vm, "stop/")).status_code == 202
    assert api.post(url(project, running_vm, "reboot/")).status_code == 409
    assert api.post(url(project, running_vm, "power-off/")).status_code == 202
    assert VirtualMachine.objects.get(pk=running_vm.pk).task_state == VmTask.POWERING_OFF


def test_the_host_resets_once_per_generation_and_powers_off_at_once(tmp_path):
    runtime.configure(AgentConfig.from_env(host="cpu-07", instances_dir=tmp_path))
    try:
        fake = FakeDriver()
        vm_id = "0b4e2c1a-5d6f-4e3b-9a8c-7d6e5f4a3b2c"
        base = {"vm_id": vm_id, "name": "p/g", "hostname": "g", "vcpus": 1, "memory_mib": 64}
        host_tasks.apply(VmApply(generation=1, desired="running", **base), fake)
        reset = VmApply(generation=2, desired="running", reset=True, **base)
        assert host_tasks.apply(reset, fake) == (2, "running")
        assert host_tasks.apply(reset, fake) == (2, "running")  # a repeated message
        assert fake.resets_of(vm_id) == 1
        off = VmApply(generation=3, desired="stopped", graceful_timeout_s=0, **base)
        assert host_tasks.apply(off, fake) == (3, "shutoff")
        assert fake.get_guest(vm_id).power is PowerState.SHUTOFF
        # The guest's serial console is logged in its instance folder.
        assert fake._guests[vm_id].spec.console_log == str(tmp_path / vm_id / "console.log")
    finally:
        runtime.configure(None)
