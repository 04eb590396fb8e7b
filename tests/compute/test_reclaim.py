"""Reclamation, the metadata endpoint and the project's reclamation report: every step
announced with its time before it happens, audited, and cancelled when its reason goes."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from compute import services
from compute.choices import Priority, ReclaimAction, VmState
from compute.models import Device, VirtualMachine
from compute.services import reclaim
from controlplane.models import AuditEvent, Event
from tenants import services as tenants
from tenants.choices import ProjectStatus
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_template, make_vm
from tests.isolation import ProjectEndpointContract

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(project, sent):
    make_host()
    vm = make_vm(project, template=make_template(gpus=1))
    report(fresh(vm), "running")
    return fresh(vm)


def _expire(project):
    tenants.project_set_status(project=project, status=ProjectStatus.EXPIRED, reason="test")


def test_an_expired_projects_vm_is_announced_stopped_then_deleted(project, running, sent, settings):
    settings.RECLAIM_EXPIRED_NOTICE_S = 3600
    settings.RECLAIM_EXPIRED_GRACE_S = 86400
    now = timezone.now()
    _expire(project)
    assert services.reclaim_run(now=now) == {"announced": 1}
    vm = fresh(running)
    assert (vm.reclaim_action, vm.reclaim_reason) == ("stop", "project_expired")
    assert vm.reclaim_at == now + timedelta(seconds=3600)
    event = Event.objects.get(kind="vm.reclaim_scheduled")
    assert event.payload["at"] == vm.reclaim_at.isoformat() and event.payload["action"] == "stop"
    assert vm.state == VmState.RUNNING  # announced, not done
    assert services.reclaim_run(now=now + timedelta(seconds=10)) == {}
    services.reclaim_run(now=now + timedelta(seconds=3601))
    vm = fresh(vm)
    # shelved, not only stopped: its claim returns to the fleet
    assert vm.state == VmState.SHELVING and vm.reclaim_action == ReclaimAction.DELETE
    assert AuditEvent.objects.filter(action="vm.reclaimed", detail__action="stop").exists()
    report(vm, "absent")  # the host kept its disk and let go of the guest
    assert fresh(vm).state == VmState.SHELVED and fresh(vm).host_id is None
    later = vm.reclaim_at + timedelta(seconds=1)
    services.reclaim_run(now=later)
    assert fresh(vm).state == VmState.DELETED  # it held no host: gone at once
    assert Event.objects.filter(kind="vm.reclaimed").count() == 2


def test_renewing_the_project_cancels_what_was_scheduled(project, running, sent):
    _expire(project)
    services.reclaim_run()
    tenants.project_set_status(project=project, status=ProjectStatus.ACTIVE, reason="renewed")
    assert services.reclaim_run() == {"cancelled": 1}
    vm = fresh(running)
    assert vm.reclaim_action == "" and vm.state == VmState.RUNNING
    assert Event.objects.filter(kind="vm.reclaim_cancelled").exists()


def test_idle_vms_are_warned_then_stopped_unless_busy_again(project, running, sent, settings):
    settings.IDLE_AFTER_S, settings.IDLE_WARNING_S, settings.IDLE_CPU_PERCENT = 600, 300, 2.0
    t0 = timezone.now()
    vm = running
    # Two samples 10 minutes apart with almost no CPU: idle since the first.
    changes = reclaim.cpu_observed(vm, 10**9, t0 - timedelta(seconds=700))
    VirtualMachine.objects.filter(pk=vm.pk).update(**changes, launched_at=t0 - timedelta(days=1))
    vm = fresh(vm)
    changes = reclaim.cpu_observed(vm, 10**9 + 10**6, t0)
    assert "active_at" not in changes  # 1 ms over 700 s: idle
    VirtualMachine.objects.filter(pk=vm.pk).update(**changes)
    assert services.reclaim_run(now=t0) == {"warned": 1}
    warning = Event.objects.get(kind="vm.idle_warning")
    assert warning.payload["at"] == (t0 + timedelta(seconds=300)).isoformat()
    # Busy again (a second of CPU in 10 s on 1 vCPU... of 16: 0.6 %? use 5 s of 16 vCPUs).
    vm = fresh(vm)
    busy = reclaim.cpu_observed(vm, vm.cpu_time_ns + 16 * 5 * 10**9, t0 + timedelta(seconds=10))
    assert "active_at" in busy
    VirtualMachine.objects.filter(pk=vm.pk).update(**busy)
    assert services.reclaim_run(now=t0 + timedelta(seconds=20)) == {"cancelled": 1}
    # Idle for good: warned again, and stopped when the warning runs out.
    VirtualMachine.objects.filter(pk=vm.pk).update(active_at=t0 - timedelta(seconds=700))
    services.reclaim_run(now=t0 + timedelta(seconds=30))
    services.reclaim_run(now=t0 + timedelta(seconds=400))
    vm = fresh(vm)
    assert vm.state == VmState.SHELVING and vm.reclaim_action == ""
    assert AuditEvent.objects.filter(action="vm.reclaimed", detail__reason="idle").exists()
    # Idle reclamation frees the GPU: once the host let go, another VM takes it.
    gpu = Device.objects.get(vm=vm)
    report(vm, "absent")
    assert fresh(vm).state == VmState.SHELVED and not Device.objects.filter(vm=vm).exists()
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    other = make_vm(project, template=make_template(gpus=8))
    assert fresh(other).state == VmState.PROVISIONING
    assert Device.objects.filter(vm=other, pk=gpu.pk).exists()


def test_idle_reclamation_can_be_turned_off(project, running, sent, settings):
    settings.IDLE_AFTER_S = 0
    VirtualMachine.objects.filter(pk=running.pk).update(
        active_at=timezone.now() - timedelta(days=30)
    )
    assert services.reclaim_run() == {}


# --- the metadata endpoint -----------------------------------------------------------------------


def _meta(vm, method="get", path="metadata-spot-instance-action"):
    client = APIClient()
    headers = {"HTTP_X_KUMO_METADATA_TOKEN": vm.metadata_token} if vm else {}
    return getattr(client, method)(reverse(f"api:{path}"), **headers)


def test_metadata_answers_404_without_a_notice_and_401_without_a_token(running):
    assert _meta(running).status_code == 404
    assert _meta(None).status_code == 401
    other = VirtualMachine(metadata_token="nope")
    assert _meta(other).status_code == 401
    assert len(running.metadata_token) >= 40


def test_metadata_shows_the_notice_and_takes_the_acknowledgement(project, sent):
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    make_host()
    victim = make_vm(project, template=make_template(gpus=8), priority=Priority.SPOT)
    report(fresh(victim), "running")
    make_vm(project, template=make_template(gpus=8), name="urgent")
    victim = fresh(victim)
    body = _meta(victim).json()
    assert body["action"] == "stop"
    assert body["time"].replace("Z", "+00:00") == victim.eviction_deadline.isoformat()
    acked = _meta(victim, "post", "metadata-spot-acknowledge")
    assert acked.status_code == 200
    assert fresh(victim).task_state == "stopping"
    # The apply message carries the token to the guest's seed.
    message = [m for q, t, m in sent if m["vm_id"] == str(victim.pk)][-1]
    assert message["extra"]["metadata"]["token"] == victim.metadata_token


def test_metadata_records_a_running_guests_checkpoint_and_refuses_a_stopped_ones(running):
    answer = _meta(running, "post", "metadata-spot-checkpoint")
    assert answer.status_code == 200
    saved = fresh(running).checkpointed_at
    assert saved is not None
    assert answer.json()["checkpointed_at"].replace("Z", "+00:00") == saved.isoformat()
    # The interval since its start (its first save): when Kumo expects the next.
    since = fresh(running).running_since or fresh(running).created_at
    assert answer.json()["checkpoint_interval_s"] == pytest.approx(
        (saved - since).total_seconds(), abs=0.01
    )
    services.vm_stop(vm=fresh(running))
    report(fresh(running), "shutoff")
    refused = _meta(fresh(running), "post", "metadata-spot-checkpoint")
    assert refused.status_code == 409
    assert refused.json()["details"] == {"state": ["stopped"]}
    assert "running" in refused.json()["message"]
    assert fresh(running).checkpointed_at == saved  # unchanged
    assert _meta(None, "post", "metadata-spot-checkpoint").status_code == 401


def test_the_seed_holds_the_token_readable_by_root_only(tmp_path):
    from compute.drivers import cloudinit
    from compute.host_tasks import METADATA_ENV, metadata_files
    from compute.protocol import VmApply

    message = VmApply(
        vm_id="x", generation=1, desired="running",
        extra={"metadata": {"url": "http://k/api/v1/metadata", "token": "t0k"}},
    )  # fmt: skip
    files = metadata_files(message)
    assert (
        files[METADATA_ENV]
        == "KUMO_METADATA_URL=http://k/api/v1/metadata\nKUMO_METADATA_TOKEN=t0k\n"
    )
    seed = cloudinit.write_seed(
        tmp_path / "seed.iso", instance_id="x", hostname="x", private_files=files
    )
    vendor = cloudinit.read_seed(seed)["vendor-data"]
    assert "KUMO_METADATA_TOKEN=t0k" in vendor and "'0600'" in vendor


# --- the project's report and the operators' guarantees ------------------------------------------


def test_the_report_shows_thresholds_minimum_and_schedule(client_for, project, running, settings):
    settings.IDLE_AFTER_S = 1234
    settings.SPOT_EVICTION_COST_S = 90.0
    settings.SPOT_NOTICE_STRETCH_S = 20.0
    services.guarantee_set(project=project, min_gpus=4)
    _expire(project)
    services.reclaim_run()
    url = reverse("api:project-reclamation-list", kwargs={"project_slug": project.slug})
    body = client_for(project.owner).get(url).json()
    assert body["min_gpus"] == 4 and body["thresholds"]["idle_after_s"] == 1234
    assert body["thresholds"]["spot_eviction_cost_s"] == 90.0  # how victims are weighed
    assert body["thresholds"]["spot_notice_stretch_s"] == 20.0  # how long a notice may run
    assert body["scheduled"][0]["vm"] == str(running.pk)
    assert body["scheduled"][0]["action"] == "stop"


def test_operators_set_guarantees(client_for, staff, project):
    make_host()  # a minimum is refused beyond the fleet's GPUs (``compute.guarantees``)
    api = client_for(staff)
    url = reverse("api:admin-capacityguarantee-detail", kwargs={"project": project.slug})
    assert api.put(url, {"min_gpus": 8}, format="json").status_code == 200
    assert api.get(url).json()["min_gpus"] == 8
    assert AuditEvent.objects.filter(action="capacity_guarantee.update").exists()
    missing = reverse("api:admin-capacityguarantee-detail", kwargs={"project": "nope"})
    assert api.put(missing, {"min_gpus": 8}, format="json").status_code == 404


class TestReclamationIsolation(ProjectEndpointContract):
    basename = "project-reclamation"
    singleton = True
    actions = ("list",)
