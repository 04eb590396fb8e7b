"""Usage intervals follow state changes exactly: VMs through the compute services and the
host's reports, global IPs through allocate and release, and random lifecycles (hypothesis)
whose intervals add up to their state history to the microsecond."""

import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compute import services
from compute.choices import Priority, VmState
from compute.services.lifecycle import current_operation, transition
from tenants import services as tenants
from tenants import usage
from tenants.choices import UsageResource
from tenants.models import UsageRecord
from tests.factories import make_host, make_image, make_pool, make_template, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_host_messages(monkeypatch):
    from controlplane.celery import app

    monkeypatch.setattr(app, "send_task", lambda *a, **k: None)


@pytest.fixture
def project(project):
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64, global_ips=8)
    return project


def report(vm, power):
    return services.vm_observed(
        host=vm.host.name,
        payload={"vm_id": str(vm.pk), "generation": vm.generation, "power": power, "ok": True,
                 "operation_id": current_operation(vm)},
        sent_at=timezone.now(),
    )  # fmt: skip


def fresh(vm):
    from compute.models import VirtualMachine

    return VirtualMachine.objects.select_related("host", "project").get(pk=vm.pk)


def records(vm, **filters):
    return list(
        UsageRecord.objects.filter(subject_id=str(vm.pk), **filters).order_by("started_at", "id")
    )


def open_resources(vm):
    return {
        (r.resource, r.model, r.quantity, r.priority) for r in records(vm, ended_at__isnull=True)
    }


def test_a_vm_bills_vcpus_memory_and_gpus_by_model_while_placed_and_running(project):
    make_host()
    vm = make_vm(project, template=make_template(gpus=2, memory_gib=114), priority=Priority.SPOT)
    assert vm.state == VmState.PROVISIONING
    assert open_resources(vm) == {
        ("vcpu", "", Decimal(32), "spot"),
        ("memory", "", Decimal(114), "spot"),
        ("gpu", "A100-SXM4-40GB", Decimal(2), "spot"),
    }
    report(vm, "running")
    assert len(records(vm)) == 3  # provisioning -> running: the same intervals go on


def test_stopped_vms_bill_what_they_hold_at_the_held_price(project):
    make_host()
    vm = make_vm(project, template=make_template(gpus=1))
    report(vm, "running")
    vm, _ = services.vm_stop(vm=fresh(vm))
    assert len(open_resources(vm)) == 3  # stopping: the guest still runs
    report(fresh(vm), "shutoff")
    vm = fresh(vm)
    assert vm.state == VmState.STOPPED
    # Holding is never free: the same claim at priority "held", and the disk as storage.
    assert {(r, q, p) for r, _m, q, p in open_resources(vm)} == {
        ("vcpu", Decimal(vm.vcpus), "held"),
        ("memory", Decimal(vm.memory_mib) / 1024, "held"),
        ("gpu", Decimal(1), "held"),
        ("storage", Decimal(vm.disk_gib), "on_demand"),
    }
    assert {r.started_at for r in records(vm, ended_at__isnull=True)} == {vm.updated_at}
    vm, _ = services.vm_start(vm=vm)
    assert len(open_resources(vm)) == 4  # starting: still held until it runs
    report(vm, "running")
    vm = fresh(vm)
    assert len(open_resources(vm)) == 3 and len(records(vm)) == 10
    assert {r.started_at for r in records(vm, ended_at__isnull=True)} == {vm.updated_at}


def test_delete_closes_at_the_request_and_a_pending_vm_never_bills(project):
    make_host(kind="cpu")
    pending = make_vm(project, template=make_template(gpus=8))
    assert pending.state == VmState.PENDING and records(pending) == []
    services.vm_delete(vm=fresh(pending))
    assert records(pending) == []
    vm = make_vm(project)
    report(vm, "running")
    vm, _ = services.vm_delete(vm=fresh(vm))
    assert open_resources(vm) == set()
    report(fresh(vm), "absent")
    assert fresh(vm).state == VmState.DELETED and open_resources(vm) == set()


def test_a_host_error_while_provisioning_closes_the_intervals(project):
    make_host()
    vm = make_vm(project)
    services.vm_observed(
        host=vm.host.name,
        payload={"vm_id": str(vm.pk), "generation": vm.generation, "ok": False, "error": "boom"},
        sent_at=timezone.now(),
    )
    vm = fresh(vm)
    assert vm.state == VmState.ERROR and open_resources(vm) == set()
    assert all(r.ended_at == vm.updated_at for r in records(vm))


def test_the_reaper_closes_a_stuck_provisioning_vm(project, settings):
    make_host()
    vm = make_vm(project)
    later = timezone.now() + timedelta(seconds=settings.VM_OPERATION_DEADLINE_S + 1)
    assert services.vms_reap_stuck(now=later) == 1
    assert fresh(vm).state == VmState.ERROR
    assert {r.ended_at for r in records(vm)} == {later}


def test_an_evicted_spot_vm_stops_paying_at_the_eviction(project):
    """Eviction: the notice (evicting) still bills, the guest runs out its notice; once its
    host reports it shut off the hand-over evicts it, and its intervals end at the VM's
    ``evicted_at``."""
    from compute.services import spot

    make_host()
    vm = make_vm(project, template=make_template(gpus=1), priority=Priority.SPOT)
    report(vm, "running")
    vm = transition(fresh(vm), state=VmState.EVICTING)
    assert len(open_resources(vm)) == 3
    report(fresh(vm), "shutoff")
    vm = fresh(vm)
    if vm.state == VmState.EVICTING:  # the hand-over runs from the host's reports
        spot.evictions_hand_over(vm.host)
        vm = fresh(vm)
    assert vm.state == VmState.EVICTED and vm.evicted_at is not None
    assert open_resources(vm) == set()
    assert {r.ended_at for r in records(vm)} == {vm.evicted_at}


def test_eviction_through_transition_closes_at_the_transitions_time(project):
    make_host()
    vm = make_vm(project, priority=Priority.SPOT)
    report(vm, "running")
    vm = transition(fresh(vm), state=VmState.EVICTED)
    assert {r.ended_at for r in records(vm)} == {fresh(vm).updated_at}


def test_sync_is_idempotent(project):
    make_host()
    vm = make_vm(project, template=make_template(gpus=1))
    before = [(r.pk, r.started_at, r.ended_at) for r in records(vm)]
    assert usage.vm_usage_sync(fresh(vm)) == 0
    assert usage.vm_usage_sync(fresh(vm), at=timezone.now() + timedelta(hours=1)) == 0
    assert [(r.pk, r.started_at, r.ended_at) for r in records(vm)] == before


def test_global_ips_bill_from_allocate_to_release_and_the_router_address_never(project):
    from network import services as network

    make_pool()
    address = network.global_ip_allocate(project=project)
    rows = list(UsageRecord.objects.filter(resource=UsageResource.GLOBAL_IP))
    assert len(rows) == 1  # the router's own address is not billed
    assert (rows[0].subject_id, rows[0].quantity, rows[0].ended_at) == (
        str(address.pk),
        Decimal(1),
        None,
    )
    network.global_ip_release(address=address)
    rows[0].refresh_from_db()
    assert rows[0].ended_at is not None and rows[0].ended_at >= rows[0].started_at


def test_generic_open_close_resizes_and_never_overlaps(project):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    subject = project  # any model instance with a project_id: storage passes its volumes
    subject.project_id = project.pk
    usage.usage_open(subject, "storage", 100, t0)
    usage.usage_open(subject, "storage", 100, t0 + timedelta(hours=1))  # the same: no change
    usage.usage_open(subject, "storage", 200, t0 + timedelta(hours=2))  # grown
    assert usage.usage_close(subject, "storage", at=t0 + timedelta(hours=1)) == 1  # clock back
    usage.usage_open(subject, "storage", 50, t0)  # starts where the last one ended, not before
    rows = list(UsageRecord.objects.filter(resource="storage").order_by("started_at", "id"))
    spans = [(r.started_at - t0, (r.ended_at or t0) - t0, r.quantity) for r in rows]
    assert spans == [
        (timedelta(0), timedelta(hours=2), Decimal(100)),
        (timedelta(hours=2), timedelta(hours=2), Decimal(200)),
        (timedelta(hours=2), -timedelta(0), Decimal(50)),
    ]
    assert usage.usage_close(subject, "storage", at=t0 + timedelta(hours=3)) == 1
    assert usage.usage_close(subject, "storage", at=t0 + timedelta(hours=4)) == 0


# --- random lifecycles ----------------------------------------------------------------------

STATES = [s.value for s in VmState]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(STATES), st.integers(min_value=0, max_value=10**11)),
        max_size=25,
    ),
    priority=st.sampled_from([Priority.ON_DEMAND, Priority.SPOT]),
    gpus=st.sampled_from([0, 1, 8]),
    memory_mib=st.integers(min_value=1, max_value=2 * 1024**2),
)
def test_usage_totals_equal_the_state_history_exactly(project, steps, priority, gpus, memory_mib):
    """For any sequence of states at any instants (microsecond steps up to a day), the
    intervals add up, per resource, to exactly quantity x time spent in billable states,
    never overlap, and a repeated sync changes nothing."""
    from compute.models import VirtualMachine

    template = _lifecycle_template()
    vm = VirtualMachine.objects.create(
        project=project,
        name=f"life-{VirtualMachine.objects.count()}",
        template=template,
        image=_lifecycle_image(),
        priority=priority,
        vcpus=3,
        memory_mib=memory_mib,
        gpus=gpus,
        gpu_model="H100" if gpus else "",
        disk_gib=10,
    )
    at = datetime(2026, 3, 1, tzinfo=UTC)
    expected_us = 0
    state, since = VmState.PENDING, at
    for next_state, step_us in steps:
        at += timedelta(microseconds=step_us)
        if state in usage.BILLABLE_VM_STATES | usage.HELD_VM_STATES:
            expected_us += _us(at - since)
        state, since = next_state, at
        vm.state = next_state
        usage.vm_usage_sync(vm, at=at)
        assert usage.vm_usage_sync(vm, at=at) == 0  # idempotent
    end = at + timedelta(hours=1)
    if state in usage.BILLABLE_VM_STATES | usage.HELD_VM_STATES:
        expected_us += _us(end - since)
    rows = list(UsageRecord.objects.filter(subject_id=str(vm.pk)).order_by("started_at", "id"))
    quantities = {"vcpu": Decimal(3), "memory": Decimal(memory_mib) / 1024, "gpu": Decimal(gpus)}
    for resource, quantity in quantities.items():
        mine = [r for r in rows if r.resource == resource]
        if quantity == 0:
            assert mine == []
            continue
        total = sum(_us((r.ended_at or end) - r.started_at) * r.quantity for r in mine)
        assert total == expected_us * quantity, resource
        assert all(r.priority in (priority, "held") for r in mine)
        for a, b in itertools.pairwise(mine):
            assert a.ended_at is not None and a.ended_at <= b.started_at  # no overlap
        assert sum(r.ended_at is None for r in mine) <= 1


def _us(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _lifecycle_template():
    from compute.models import Template

    return Template.objects.filter(name="life").first() or make_template(gpus=0, name="life")


def _lifecycle_image():
    from compute.models import Image

    return Image.objects.filter(name="life").first() or make_image(name="life")


@pytest.mark.postgres
def test_the_sync_as_sql_writes_what_the_sync_writes(project):
    """``vm_usage_sync_ctes`` (the claim's one statement) closes and opens exactly what
    ``vm_usage_sync`` does: an interval kept, one closed, one reopened at another priority
    (the one-open-interval index holds within the statement), one starting at the last end
    of its key when that end is later; again, it writes nothing; its condition false,
    nothing either."""
    from django.db import connection

    template = make_template(gpus=2)
    at = timezone.now()
    by_python, by_sql = make_vm(project, template), make_vm(project, template)
    assert by_python.state == by_sql.state == VmState.PENDING  # no host: nothing billed yet
    for vm in (by_python, by_sql):
        mine = {"project": project, "subject_type": usage.VM_SUBJECT, "subject_id": str(vm.pk)}
        UsageRecord.objects.create(
            **mine, resource="vcpu", quantity=32, priority="on_demand",
            started_at=at - timedelta(hours=2), ended_at=at + timedelta(hours=1),
        )  # fmt: skip
        UsageRecord.objects.create(
            **mine, resource="memory", quantity=114, priority="held",
            started_at=at - timedelta(hours=1),
        )  # fmt: skip
        UsageRecord.objects.create(
            **mine, resource="storage", quantity=100, priority="on_demand",
            started_at=at - timedelta(hours=1),
        )  # fmt: skip
        UsageRecord.objects.create(
            **mine, resource="gpu", model=template.gpu_model, quantity=2, priority="on_demand",
            started_at=at - timedelta(hours=1),
        )  # fmt: skip

    def rows(vm):
        return sorted(
            UsageRecord.objects.filter(subject_id=str(vm.pk)).values_list(
                "resource", "model", "quantity", "priority", "started_at", "ended_at"
            ),
            key=repr,
        )

    def by_statement(when):
        ctes, params = usage.vm_usage_sync_ctes(by_sql, state="provisioning", at=at, when=when)
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH {ctes} SELECT (SELECT count(*) FROM usage_closed),"
                " (SELECT count(*) FROM usage_opened)",
                params,
            )
            return cursor.fetchone()

    by_python.state = "provisioning"
    assert usage.vm_usage_sync(by_python, at=at) == 4
    assert by_statement("true") == (2, 2)
    assert rows(by_sql) == rows(by_python)
    assert ("vcpu", "", 32, "on_demand", at + timedelta(hours=1), None) in rows(by_sql)
    assert by_statement("true") == (0, 0)

    by_sql.disk_gib, by_sql.priority = 50, "spot"  # it would change; the condition says no
    assert by_statement("false") == (0, 0)
    assert rows(by_sql) == rows(by_python)
