"""The VM life cycle in the services: create with quota and placement, guarded actions, the
host's reports moving states, release of capacity, reconcile, stuck work."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from compute import services
from compute.choices import HostState, PowerState, Priority, VmState, VmTask
from compute.models import Device, Host, VirtualMachine
from compute.protocol import VM_APPLY_TASK
from compute.selectors import host_usage_drift
from compute.services.lifecycle import current_operation
from controlplane.errors import Conflict, InvalidInput, QuotaExceeded
from controlplane.models import Event, Operation
from tenants import quotas as tenant_quotas
from tenants import services as tenants
from tenants.choices import ProjectStatus
from tests.factories import make_host, make_image, make_template, make_vm

pytestmark = pytest.mark.django_db


class Sent(list):
    """The messages the controller published to host agents (queue, task, kwargs): the
    on-commit callbacks of committed work are run each time the list is read."""

    def __init__(self):
        super().__init__()
        self.start = len(connection.run_on_commit)

    def flush(self):
        while self.start < len(connection.run_on_commit):
            self.start += 1
            connection.run_on_commit[self.start - 1][1]()

    def __getitem__(self, index):
        self.flush()
        return super().__getitem__(index)

    def __len__(self):
        self.flush()
        return super().__len__()

    def __iter__(self):
        self.flush()
        return super().__iter__()


@pytest.fixture
def sent(monkeypatch):
    from controlplane.celery import app

    messages = Sent()
    monkeypatch.setattr(
        app, "send_task", lambda name, kwargs, queue: list.append(messages, (queue, name, kwargs))
    )
    return messages


@pytest.fixture
def project(project):
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    return project


def report(vm, power, *, generation=None, ok=True, error=""):
    """What the host's agent says after applying the VM's current generation."""
    return services.vm_observed(
        host=vm.host.name,
        payload={"vm_id": str(vm.pk), "generation": generation or vm.generation, "power": power,
                 "ok": ok, "error": error, "operation_id": current_operation(vm)},
        sent_at=timezone.now(),
    )  # fmt: skip


def fresh(vm):
    return VirtualMachine.objects.select_related("host", "project").get(pk=vm.pk)


def test_create_claims_gpus_on_one_cell_and_sends_the_host_its_work(project, sent):
    host = make_host("gpu-a")
    vm, operation = services.vm_create(
        project=project, name="train", template=make_template(gpus=2), image=make_image()
    )
    assert vm.state == VmState.PROVISIONING and vm.host_id == host.pk
    devices = list(Device.objects.filter(vm=vm))
    assert len(devices) == 2 and {d.numa_node for d in devices} == {vm.numa_cell}
    host.refresh_from_db()
    assert (host.vcpus_used, host.memory_mib_used) == (32, 2 * 57 * 1024)
    assert operation.kind == "vm.create" and operation.project == project
    queue, task, message = sent[-1]
    assert (queue, task) == ("host.gpu-a", VM_APPLY_TASK)
    assert message["desired"] == "running" and message["generation"] == vm.generation
    assert sorted(d["address"] for d in message["devices"]) == sorted(
        d.pci_address for d in devices
    )


def test_running_report_finishes_the_create(project, sent):
    make_host()
    vm = make_vm(project, template=make_template(gpus=1))
    report(vm, "running")
    vm = fresh(vm)
    assert (vm.state, vm.power_state, vm.task_state) == (VmState.RUNNING, "running", "")
    assert vm.launched_at is not None
    assert Operation.objects.get(kind="vm.create").state == "succeeded"


def test_stale_reports_change_nothing(project, sent):
    make_host()
    vm = make_vm(project)
    report(vm, "running")
    vm, _ = services.vm_stop(vm=fresh(vm))
    report(vm, "running", generation=vm.generation - 1)  # the create's report, late
    assert fresh(vm).task_state == VmTask.STOPPING
    report(vm, "shutoff")
    assert fresh(vm).state == VmState.STOPPED


def test_nothing_fits_the_vm_waits_pending_with_the_reason_then_is_placed(project, sent):
    make_host("cpu-a", kind="cpu")
    vm = make_vm(project, template=make_template(gpus=4))
    assert vm.state == VmState.PENDING and vm.host is None
    assert "4 A100-SXM4-40GB GPUs on one NUMA cell" in vm.state_reason
    assert not [m for m in sent if m[1] == VM_APPLY_TASK]
    make_host("gpu-late")
    assert services.vm_schedule_pending() == 1
    vm = fresh(vm)
    assert vm.state == VmState.PROVISIONING and vm.host.name == "gpu-late"
    assert sent[-1][0] == "host.gpu-late"


def test_a_spot_size_the_view_has_no_room_for_is_not_tried_in_a_pass(project, sent, monkeypatch):
    from compute.services import vms as vm_services

    make_host("cpu-a", kind="cpu")
    t4, t0 = make_template(gpus=4), make_template(name="cpu-small", vcpus=2, memory_gib=4)
    waiting = [make_vm(project, template=t4, priority=Priority.SPOT) for _ in range(3)]
    VirtualMachine.objects.filter(pk__in=[v.pk for v in waiting]).update(state_reason="")
    tried = []
    real_place = vm_services.place
    monkeypatch.setattr(
        vm_services, "place", lambda vm, **kw: (tried.append(vm.pk), real_place(vm, **kw))
    )
    cpu = make_vm(project, template=t0, priority=Priority.SPOT)  # placed at once
    tried.clear()
    assert services.vm_schedule_pending() == 0
    assert tried == []  # no host has room for the size: none of them is read or locked
    reasons = {fresh(v).state_reason for v in waiting}
    assert len(reasons) == 1 and "4 A100-SXM4-40GB GPUs on one NUMA cell" in reasons.pop()
    assert fresh(cpu).state == VmState.PROVISIONING
    make_host("gpu-late")
    assert services.vm_schedule_pending() == 2  # room for two 4-GPU VMs on one host
    assert [fresh(v).state for v in waiting].count(VmState.PROVISIONING) == 2
    assert len(tried) == 2  # the third is not tried once the view has no room left


def test_a_pass_reads_a_long_queue_of_one_size_a_page_at_a_time(project, sent, monkeypatch):
    """A pass reads the VMs of a size a page at a time: with room for one of forty it reads
    the first page only, and with room for more it reads on, page after bigger page, to its
    ``limit``."""
    from compute.services import vms as vm_services

    monkeypatch.setattr(vm_services, "_FIRST_PAGE", 4)
    t1 = make_template(gpus=1)
    waiting = [make_vm(project, template=t1, priority=Priority.SPOT) for _ in range(40)]
    make_host("gpu-a")
    holders = [make_vm(project, template=make_template(name=f"h{n}", gpus=n)) for n in (4, 2, 1)]
    reads = []
    real_pages = vm_services._pages

    def counted(*args, **kwargs):
        for row in real_pages(*args, **kwargs):
            reads.append(row[0])
            yield row

    monkeypatch.setattr(vm_services, "_pages", counted)
    with CaptureQueriesContext(connection) as queries:
        assert services.vm_schedule_pending() == 1
    # The queue's reads: the pass's rows (``placement.Queued``) with their age, a page each.
    queue_reads = [
        q["sql"] for q in queries if 'AS "kept_disk"' in q["sql"] and "LIMIT" in q["sql"]
    ]
    assert len(queue_reads) == 2  # the first page of the VMs not plain spot, and of the size
    assert all("LIMIT 4" in sql for sql in queue_reads)
    assert len(reads) <= 4
    assert fresh(waiting[0]).state == VmState.PROVISIONING  # the oldest first

    for holder in holders:  # 7 GPUs free again, and three hosts more: room for 31
        services.vm_delete(vm=fresh(holder))
        report(fresh(holder), "absent")
    for name in ("gpu-b", "gpu-c", "gpu-d"):
        make_host(name)
    assert services.vm_schedule_pending(limit=30) == 30  # pages of 4, 16, then 64
    states = [fresh(v).state for v in waiting]
    assert states[:31] == [VmState.PROVISIONING] * 31 and VmState.PROVISIONING not in states[31:]


def test_a_pass_reads_the_fleet_once_however_many_sizes_find_no_room(project, sent, monkeypatch):
    """Each spot size without room on the kept view takes a fresh look at the hosts, as
    ``place`` would; one look a pass is enough: the view follows the pass's own claims."""
    from compute import placement

    make_host("gpu-a")
    make_vm(project, template=make_template(name="g8", gpus=8))  # the only host is full
    for gpus in (1, 2, 4):
        make_vm(project, template=make_template(name=f"s{gpus}", gpus=gpus), priority="spot")
    loads = []
    real_load = placement.load_scheduler
    monkeypatch.setattr(
        placement, "load_scheduler", lambda **kw: loads.append(1) or real_load(**kw)
    )
    VirtualMachine.objects.filter(priority=Priority.SPOT).update(state_reason="")  # untold

    assert services.vm_schedule_pending() == 0

    assert len(loads) == 1
    reasons = list(
        VirtualMachine.objects.filter(priority=Priority.SPOT).values_list("state_reason", flat=True)
    )
    assert len(reasons) == 3 and all(r.startswith("no host has") for r in reasons)


def test_a_small_spot_vm_behind_a_full_pass_of_sizes_without_room_is_placed(project, sent):
    make_host("gpu-a")
    t4, t8, t1 = make_template(gpus=4), make_template(name="g8", gpus=8), make_template(name="g1")
    held = [make_vm(project, name=f"od-{n}", template=t4) for n in range(2)]  # the host is full
    big = [make_vm(project, name=f"big-{n}", template=t8, priority=Priority.SPOT) for n in range(3)]
    small = make_vm(project, name="small", template=t1, priority=Priority.SPOT)
    assert small.state == VmState.PENDING
    services.vm_delete(vm=fresh(held[0]))
    report(fresh(held[0]), "absent")  # four GPUs of one cell free: no room for 8 on one host
    # More VMs of a size without room wait before it than a pass tries: it is placed anyway.
    assert services.vm_schedule_pending(limit=2) == 1
    assert fresh(small).state == VmState.PROVISIONING
    reasons = {fresh(v).state_reason for v in big}
    assert len(reasons) == 1 and "8 A100-SXM4-40GB GPUs" in reasons.pop()


def test_a_pass_tries_on_demand_first_then_spot_by_age_across_groups_and_sizes(
    project, sent, monkeypatch
):
    """The pass reads its queue as ranges (the VMs that are not plain spot ones; plain spot
    VMs a size at a time) and merges them: on-demand first, then spot oldest first, whether
    in a placement group or of any size with room."""
    from compute.services import vms as vm_services

    make_host("gpu-a")
    t1, t8 = make_template(name="g1", gpus=1), make_template(name="g8", gpus=8)
    holder = make_vm(project, name="holder", template=t8)  # the host is full
    group = services.placement_group_create(project=project, name="grp", policy="compact")
    spot = Priority.SPOT
    s1 = make_vm(project, name="s1", template=t1, priority=spot)
    g1 = make_vm(project, name="g1", template=t1, priority=spot, placement_group=group)
    s2 = make_vm(project, name="s2", template=t1, priority=spot)
    od = make_vm(project, name="od", template=t1)
    assert {fresh(v).state for v in (s1, g1, s2, od)} == {VmState.PENDING}
    tried = []
    real_place = vm_services.place
    monkeypatch.setattr(
        vm_services, "place", lambda vm, **kw: (tried.append(vm.name), real_place(vm, **kw))
    )
    services.vm_delete(vm=fresh(holder))
    report(fresh(holder), "absent")
    tried.clear()
    assert services.vm_schedule_pending() == 4
    assert tried == ["od", "s1", "g1", "s2"]


def test_a_queue_told_why_it_waits_is_not_written_again_as_the_counts_move(project, sent):
    """A waiting spot VM keeps the reason it was told while only the counts in it move (a
    host more, one turned away): a pass over a long queue writes no row of it again. A VM
    waiting for another reason is told this one."""
    make_host("gpu-a")
    t8 = make_template(name="g8", gpus=8)
    make_vm(project, name="od", template=t8)  # the host is full
    spot = Priority.SPOT
    queued = [make_vm(project, name=f"q-{n}", template=t8, priority=spot) for n in range(3)]
    told = fresh(queued[0]).state_reason
    assert told.startswith("no host has") and "1 hosts up" in told
    VirtualMachine.objects.filter(pk=queued[2].pk).update(state_reason="waiting for capacity")
    make_host("cpu-a", kind="cpu")  # one host more: the counts of the reason move
    assert services.vm_schedule_pending() == 0
    assert [fresh(v).state_reason for v in queued[:2]] == [told, told]
    now_told = fresh(queued[2]).state_reason
    assert now_told.startswith("no host has") and "2 hosts up" in now_told


def test_a_pass_over_a_queue_told_already_writes_no_reason(project, sent):
    """Every waiting VM was told why when it joined the queue: a pass finds no VM untold
    (a read of an index that holds only those) and writes (or scans for) no reason."""
    make_host("gpu-a")
    t8, t4 = make_template(name="g8", gpus=8), make_template(name="g4", gpus=4)
    make_vm(project, name="od", template=t8)  # the host is full
    spot = Priority.SPOT
    waiting = [make_vm(project, name=f"w8-{n}", template=t8, priority=spot) for n in range(2)]
    waiting += [make_vm(project, name=f"w4-{n}", template=t4, priority=spot) for n in range(2)]
    told = [fresh(v).state_reason for v in waiting]
    assert all(r.startswith("no host has") for r in told)
    make_host("cpu-a", kind="cpu")  # the counts in the reasons move
    with CaptureQueriesContext(connection) as queries:
        assert services.vm_schedule_pending() == 0
    writes = [q["sql"] for q in queries if q["sql"].startswith("UPDATE")]
    assert writes == []
    assert [fresh(v).state_reason for v in waiting] == told


def test_not_waiting_answers_409_and_creates_nothing(project, sent):
    make_host(kind="cpu")
    with pytest.raises(Conflict) as e:
        make_vm(project, template=make_template(gpus=8), wait_for_capacity=False)
    assert e.value.code == "no_capacity"
    assert VirtualMachine.objects.count() == 0 and Operation.objects.count() == 0


def test_quota_is_enforced_at_create(project, sent):
    make_host()
    tenants.quota_set(project=project, gpus=3, vcpus=1024, memory_gib=8192, vms=64)
    template = make_template(gpus=2)
    make_vm(project, template=template)
    with pytest.raises(QuotaExceeded, match="gpus"):
        make_vm(project, template=template)
    assert VirtualMachine.objects.for_project(project).count() == 1


def test_usage_is_one_query_per_app_and_counts_what_holds_capacity(
    project, sent, django_assert_num_queries
):
    make_host()
    template = make_template(gpus=2)
    make_vm(project, template=template)
    deleted = make_vm(project, name="gone", template=make_template(gpus=0, name="cpu-x"))
    services.vm_delete(vm=fresh(deleted))  # placed: deleting until the host answers
    report(fresh(deleted), "absent")
    with django_assert_num_queries(3):  # compute's aggregate, network's, storage's
        used = tenant_quotas.usage(project)
    assert used["vms"] == 1 and used["gpus"] == 2
    assert used["vcpus"] == template.vcpus and used["memory_gib"] == template.memory_gib


def test_drained_and_down_hosts_take_nothing(project, sent, settings):
    host = make_host()
    services.host_set_state(host=host, state=HostState.DRAINING)
    vm = make_vm(project)
    assert vm.state == VmState.PENDING
    assert "1 not in service" in vm.state_reason
    services.host_set_state(host=host, state=HostState.UP)
    assert services.vm_schedule_pending() == 1


def test_illegal_actions_answer_409_naming_the_state(project, sent):
    make_host()
    vm = make_vm(project)
    with pytest.raises(Conflict, match="provisioning; cannot stop") as e:
        services.vm_stop(vm=vm)
    assert e.value.details["state"] == ["provisioning"]
    report(vm, "running")
    vm, _ = services.vm_stop(vm=fresh(vm))
    with pytest.raises(Conflict, match=r"running \(stopping in progress\); cannot reboot"):
        services.vm_reboot(vm=vm)


def test_two_racing_actions_one_wins(project, sent):
    make_host()
    vm = make_vm(project)
    report(vm, "running")
    first, second = fresh(vm), fresh(vm)
    services.vm_stop(vm=first)
    # The loser re-reads the row under its lock and names what it found (issue 13, fault 3).
    with pytest.raises(Conflict, match="stopping in progress"):
        services.vm_reboot(vm=second)


def test_stop_start_reboot_round_trip(project, sent):
    make_host()
    vm = make_vm(project)
    report(vm, "running")
    vm, op = services.vm_stop(vm=fresh(vm))
    assert sent[-1][2]["desired"] == "stopped"
    report(vm, "shutoff")
    assert fresh(vm).state == VmState.STOPPED
    assert Operation.objects.get(pk=op.pk).state == "succeeded"
    vm, _ = services.vm_start(vm=fresh(vm))
    report(vm, "running")
    vm, _ = services.vm_reboot(vm=fresh(vm))
    assert sent[-1][2]["reboot"] is True
    report(vm, "running")
    assert (fresh(vm).state, fresh(vm).task_state) == (VmState.RUNNING, "")


def test_delete_releases_gpus_and_capacity_only_once_the_host_has_removed_it(project, sent):
    host = make_host()
    vm = make_vm(project, template=make_template(gpus=4))
    report(vm, "running")
    vm, _ = services.vm_delete(vm=fresh(vm))
    assert vm.state == VmState.DELETING and sent[-1][2]["desired"] == "absent"
    assert Device.objects.filter(vm=vm).count() == 4  # still held while the guest may run
    report(vm, "absent")
    vm = fresh(vm)
    assert vm.state == VmState.DELETED and vm.deleted_at is not None
    assert Device.objects.filter(vm=vm).count() == 0
    host.refresh_from_db()
    assert (host.vcpus_used, host.memory_mib_used) == (0, 0)
    assert host_usage_drift() == []
    report(vm, "absent")  # a repeated report releases nothing twice
    host.refresh_from_db()
    assert host.vcpus_used == 0


def test_deleting_a_pending_vm_is_immediate(project, sent):
    vm = make_vm(project)  # no hosts at all
    vm, operation = services.vm_delete(vm=vm)
    assert vm.state == VmState.DELETED and operation.state == "succeeded"
    assert Operation.objects.get(kind="vm.create").state == "failed"


def test_host_error_while_provisioning_is_an_error_state(project, sent):
    make_host()
    vm = make_vm(project)
    report(vm, "unknown", ok=False, error="cannot access storage file")
    vm = fresh(vm)
    assert vm.state == VmState.ERROR and "storage file" in vm.state_reason
    assert Operation.objects.get(kind="vm.create").error_code == "host_error"
    # Its project hears of it once (its webhooks): the same report delivered again is not
    # a second failure.
    report(vm, "unknown", ok=False, error="cannot access storage file")
    [event] = Event.objects.for_project(project).filter(kind="vm.error")
    assert (event.object_id, event.payload) == (str(vm.pk), {"error": "cannot access storage file"})
    assert vm.name in event.message


def test_guest_powered_off_from_inside_is_stopped(project, sent):
    make_host()
    vm = make_vm(project)
    report(vm, "running")
    report(vm, "shutoff")
    vm = fresh(vm)
    assert vm.state == VmState.STOPPED and "shutoff" in vm.state_reason


def test_reconcile_reissues_a_vm_whose_guest_is_missing(project, sent, settings):
    settings.RECONCILE_GRACE_S = 0
    host = make_host()
    vm = make_vm(project)
    report(vm, "running")
    before = len(sent)
    done = services.guests_reported(host=host.name, payload={"guests": []},
                                    sent_at=timezone.now())  # fmt: skip
    assert done["reissued"] == [str(vm.pk)]
    assert sent[before:][0][2]["vm_id"] == str(vm.pk)
    # Reported present and current: nothing to do.
    guest = {"vm_id": str(vm.pk), "generation": fresh(vm).generation, "power": "running"}
    done = services.guests_reported(host=host.name, payload={"guests": [guest]},
                                    sent_at=timezone.now())  # fmt: skip
    assert done == {"reissued": [], "settled": [], "orphans_destroyed": []}


def test_orphans_are_destroyed_after_the_grace_period(sent, settings):
    host = make_host()
    orphan = {"vm_id": "7d6c0b7e-0000-4000-8000-000000000001", "generation": 3,
              "power": "running"}  # fmt: skip
    settings.ORPHAN_GRACE_S = 3600
    now = timezone.now()
    first = services.guests_reported(host=host.name, payload={"guests": [orphan]}, sent_at=now)
    assert first["orphans_destroyed"] == []
    settings.ORPHAN_GRACE_S = 0
    later = now + timedelta(seconds=1)
    done = services.guests_reported(host=host.name, payload={"guests": [orphan]}, sent_at=later)
    assert done["orphans_destroyed"] == [orphan["vm_id"]]
    assert sent[-1][2] == {**sent[-1][2], "vm_id": orphan["vm_id"], "desired": "absent"}


def test_stuck_provisioning_is_marked_error(project, sent, settings):
    make_host()
    vm = make_vm(project)
    later = timezone.now() + timedelta(seconds=settings.VM_OPERATION_DEADLINE_S + 1)
    assert services.vms_reap_stuck(now=later) == 1
    vm = fresh(vm)
    assert vm.state == VmState.ERROR and "no answer from" in vm.state_reason


def test_a_down_host_makes_its_vms_power_unknown(project, sent, settings):
    host = make_host()
    vm = make_vm(project)
    report(vm, "running")
    Host.objects.filter(pk=host.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    services.hosts_check()
    assert fresh(vm).power_state == PowerState.UNKNOWN


def test_suspended_projects_start_nothing(project, sent):
    make_host()
    project.status = ProjectStatus.SUSPENDED
    project.save()
    with pytest.raises(Conflict, match="suspended"):
        make_vm(project)


def test_spot_needs_a_template_that_allows_it(project, sent):
    with pytest.raises(InvalidInput, match="does not allow spot"):
        make_vm(project, template=make_template(spot_allowed=False), priority=Priority.SPOT)


def test_inventory_report_is_idempotent_and_marks_missing_devices(sent):
    host = make_host("gpu-inv")
    assert Device.objects.filter(host=host, kind="gpu").count() == 8
    assert Device.objects.filter(host=host, kind="rdma_vf").count() == 16
    make_host("gpu-inv")  # the same report again
    assert Device.objects.filter(host=host).count() == 26
    services.inventory_reported(
        host="gpu-inv", payload={"cpus": 128, "memory_mib": 1024, "devices": []},
        sent_at=timezone.now() + timedelta(seconds=5),
    )  # fmt: skip
    assert not Device.objects.filter(host=host, present=True).exists()


def test_placement_group_anti_affinity_and_affinity(project, sent):
    for name in ("h1", "h2"):
        make_host(name, kind="cpu")
    anti = services.placement_group_create(project=project, name="spread", policy="anti_affinity")
    hosts = {make_vm(project, placement_group=anti).host.name for _ in range(2)}
    assert hosts == {"h1", "h2"}
    third = make_vm(project, placement_group=anti)
    assert third.state == VmState.PENDING and "anti-affinity" in third.state_reason
    together = services.placement_group_create(project=project, name="pair", policy="affinity")
    first = make_vm(project, placement_group=together)
    assert make_vm(project, placement_group=together).host_id == first.host_id


def test_a_report_reads_and_locks_its_host_and_vm_as_the_orm_would(project, sent):
    from django.core.exceptions import ValidationError
    from django.forms.models import model_to_dict

    from compute.services import reconcile

    make_host("gpu-a")
    vm = make_vm(project, template=make_template(gpus=1))
    locked_vm = reconcile._reported_vm(str(vm.pk))
    orm_vm = VirtualMachine.objects.select_related("project").get(pk=vm.pk)
    assert model_to_dict(locked_vm) == model_to_dict(orm_vm)
    assert (locked_vm.created_at, locked_vm.updated_at) == (orm_vm.created_at, orm_vm.updated_at)
    with CaptureQueriesContext(connection) as queries:
        assert model_to_dict(locked_vm.project) == model_to_dict(orm_vm.project)  # loaded
    assert not queries.captured_queries
    host = Host.objects.get(name="gpu-a")
    assert model_to_dict(reconcile._reporting_host("gpu-a")) == model_to_dict(host)
    assert reconcile._reporting_host("gpu-b") is None
    assert reconcile._reported_vm(None) is None
    assert reconcile._reported_vm("00000000-0000-0000-0000-000000000000") is None
    with pytest.raises(ValidationError):  # as ``filter(pk="not-a-uuid")`` refuses it
        reconcile._reported_vm("not-a-uuid")

    # Each report locks the host's row, then the VM's, where the database locks rows.
    vm = fresh(vm)
    payload = {"vm_id": str(vm.pk), "generation": vm.generation, "power": "running",
               "ok": True, "operation_id": current_operation(vm)}  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        services.vm_observed(host="gpu-a", payload=payload, sent_at=timezone.now())
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")][:2]
    assert '"compute_host"' in reads[0] and '"compute_virtualmachine"' in reads[1]
    if connection.features.has_select_for_update:
        assert reads[0].endswith("FOR NO KEY UPDATE OF m")
        assert reads[1].endswith("FOR UPDATE OF m")
    assert fresh(vm).state == VmState.RUNNING
