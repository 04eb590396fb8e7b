"""Guarantees hold capacity: another project's on-demand VM cannot take a guaranteed
project's headroom, a spot VM can and is evicted with its full notice when the guaranteed
project asks; minimums adding up to more than the fleet are refused (409, by how much),
under concurrency on PostgreSQL too; a host leaving service that breaks a minimum is
an alert."""

import threading
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection

from compute import guarantees, placement, services
from compute.choices import HostState, Priority, VmState
from compute.models import CapacityGuarantee, Device, VirtualMachine
from controlplane.errors import Conflict
from controlplane.models import AuditEvent, Event
from tenants import services as tenants
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_image, make_project, make_template, make_vm

MODEL = "A100-SXM4-40GB"


def roomy_project():
    project = make_project()
    tenants.quota_set(project=project, vcpus=4096, memory_gib=16384, gpus=64, vms=64)
    return project


@pytest.mark.django_db
def test_on_demand_of_others_cannot_take_the_headroom_but_spot_can_and_is_evicted(sent):
    make_host("gpu-a")
    make_host("gpu-b")
    guaranteed, other = roomy_project(), roomy_project()
    services.guarantee_set(project=guaranteed, min_gpus=8, gpu_model=MODEL)
    t8 = make_template(gpus=8, eviction_notice_s=45)
    # One node is free for anyone; the other is the guaranteed project's headroom.
    first = make_vm(other, template=t8)
    assert first.state == VmState.PROVISIONING
    refused = make_vm(other, template=t8)
    assert refused.state == VmState.PENDING
    assert "guaranteed to other projects" in refused.state_reason
    assert refused.reserved_host_id is None  # it evicts nobody either
    # A spot VM may run in the headroom.
    borrower = make_vm(other, template=t8, priority=Priority.SPOT)
    assert borrower.state == VmState.PROVISIONING
    report(fresh(borrower), "running")
    # The periodic placement still does not give the waiting on-demand VM the room.
    services.vm_schedule_pending()
    assert fresh(refused).state == VmState.PENDING
    # The guaranteed project asks: the spot VM gets its full notice, then the room is its.
    mine = make_vm(guaranteed, template=t8)
    assert mine.state == VmState.PENDING and mine.reserved_host_id == borrower.host_id
    borrower = fresh(borrower)
    assert borrower.state == VmState.EVICTING
    assert borrower.eviction_deadline - borrower.eviction_notice_at == timedelta(seconds=45)
    from compute.services import spot

    spot.evictions_reap(now=borrower.eviction_deadline)
    report(fresh(borrower), "shutoff")
    mine = fresh(mine)
    assert mine.state == VmState.PROVISIONING and mine.host_id == borrower.host_id
    assert fresh(refused).state == VmState.PENDING


@pytest.mark.django_db
def test_over_promising_is_refused_saying_by_how_much(client_for):
    make_host("gpu-a")  # 8 GPUs
    a, b = make_project(), make_project()
    services.guarantee_set(project=a, min_gpus=6, gpu_model=MODEL)
    with pytest.raises(Conflict) as refused:
        services.guarantee_set(project=b, min_gpus=5, gpu_model=MODEL)
    assert "3 too many" in str(refused.value)
    assert not CapacityGuarantee.objects.filter(project=b).exists()
    # Through the operators' API: 409 naming the field.
    from tests.factories import UserFactory

    staff = UserFactory(is_staff=True)
    answer = client_for(staff).put(
        f"/api/v1/admin/capacity-guarantees/{b.slug}/",
        {"min_gpus": 3, "gpu_model": MODEL, "min_vcpus": 0},
        format="json",
    )
    assert answer.status_code == 409, answer.content
    assert answer.json()["details"]["min_gpus"] == ["exceeds the fleet by 1"]
    ok = client_for(staff).put(
        f"/api/v1/admin/capacity-guarantees/{b.slug}/",
        {"min_gpus": 2, "gpu_model": MODEL},
        format="json",
    )
    assert ok.status_code == 200 and ok.json()["gpu_model"] == MODEL
    with pytest.raises(Conflict):
        services.guarantee_set(project=b, min_gpus=0, min_vcpus=10_000)


@pytest.mark.django_db
def test_a_host_into_maintenance_that_breaks_a_guarantee_raises_an_alert():
    host = make_host("gpu-a")
    make_host("gpu-b")
    project = make_project()
    services.guarantee_set(project=project, min_gpus=12, gpu_model=MODEL)
    services.host_set_state(host=host, state=HostState.MAINTENANCE, reason="fans")
    alert = AuditEvent.objects.get(action="capacity.guarantee_at_risk")
    assert alert.detail["promised"] == 12 and alert.detail["in_service"] == 8
    assert "gpu-a is maintenance" in alert.detail["cause"]
    assert Event.objects.filter(project=project, kind="capacity.guarantee_at_risk").exists()
    # Within what remains: no alert.
    AuditEvent.objects.filter(action="capacity.guarantee_at_risk").delete()
    services.guarantee_set(project=project, min_gpus=8, gpu_model=MODEL)
    services.host_set_state(host=host, state=HostState.UP)
    services.host_set_state(host=host, state=HostState.DRAINING)
    assert guarantees.guarantees_check() == []
    assert not AuditEvent.objects.filter(action="capacity.guarantee_at_risk").exists()


# --- concurrency, on PostgreSQL ---------------------------------------------------------------


def _race(threads, work):
    barrier = threading.Barrier(threads)
    results, errors = [], []

    def run(index):
        try:
            barrier.wait()
            results.append(work(index))
        except Conflict as e:
            results.append(e.code)
        except Exception as e:  # pragma: no cover - shown in the assertion
            errors.append(repr(e))
        finally:
            close_old_connections()
            connection.close()

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results, errors


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_guarantees_never_over_promise():
    make_host("gpu-a")
    make_host("gpu-b")  # 16 GPUs: at most five minimums of 3
    projects = [make_project() for _ in range(12)]

    def promise(index):
        services.guarantee_set(project=projects[index], min_gpus=3, gpu_model=MODEL)
        return "ok"

    results, errors = _race(12, promise)
    assert errors == []
    assert results.count("ok") == 5 and results.count("over_promised") == 7
    assert sum(CapacityGuarantee.objects.values_list("min_gpus", flat=True)) == 15


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_on_demand_requests_never_take_the_headroom():
    make_host("gpu-a")
    make_host("gpu-b")
    guaranteed = roomy_project()
    services.guarantee_set(project=guaranteed, min_gpus=8, gpu_model=MODEL)
    others = [roomy_project() for _ in range(4)]
    template, image = make_template(gpus=2), make_image()

    def create(index):
        vm, _ = services.vm_create(
            project=others[index % 4],
            name=f"vm-{index}",
            template=template,
            image=image,
            wait_for_capacity=False,
        )
        return vm.state

    results, errors = _race(12, create)
    assert errors == []
    assert results.count(VmState.PROVISIONING) == 4  # 8 GPUs: the rest is the headroom
    taken = Device.objects.filter(vm__isnull=False, vm__priority=Priority.ON_DEMAND).count()
    assert taken == 8
    assert VirtualMachine.objects.filter(state=VmState.PROVISIONING).count() == 4


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_request_known_to_have_something_to_weigh_is_weighed_before_its_claim(sent):
    """Once this process found another project's guarantee in the way of an on-demand
    request (its claim on nothing to weigh was undone), the next one of its kind is weighed
    first and claimed once; one that finds no room and evicts spot VMs for it is weighed
    once in all, not again by its preemption. Either way the guarantee holds."""
    from django.test.utils import CaptureQueriesContext

    make_host("gpu-a")
    make_host("gpu-b")
    guaranteed, other = roomy_project(), roomy_project()
    services.guarantee_set(project=guaranteed, min_gpus=8, gpu_model=MODEL)
    t2, t8 = make_template(gpus=2), make_template(gpus=8, eviction_notice_s=45)
    placement._WEIGHED.clear()
    with CaptureQueriesContext(connection) as first:
        assert make_vm(other, template=t2).state == VmState.PROVISIONING
    with CaptureQueriesContext(connection) as second:
        assert make_vm(other, template=t2).state == VmState.PROVISIONING

    def undone(queries):
        return [q for q in queries if "ROLLBACK TO SAVEPOINT kumo_claim" in q["sql"]]

    assert undone(first) and not undone(second)
    locks = [q for q in second if "pg_advisory_xact_lock" in q["sql"]]
    assert len(locks) == 1

    # A third node, spot VMs on the two left, and the other project's 8-GPU request: it
    # is admitted (the headroom stays whole) but finds no room, and evicts a spot VM.
    make_host("gpu-c")
    borrowers = [make_vm(other, template=t8, priority=Priority.SPOT) for _ in range(2)]
    for borrower in borrowers:
        assert borrower.state == VmState.PROVISIONING
        report(fresh(borrower), "running")
    with CaptureQueriesContext(connection) as preempting:
        waiting = make_vm(other, template=t8)
    assert waiting.state == VmState.PENDING
    assert waiting.reserved_host_id in {b.host_id for b in borrowers}
    assert "EVICTING" in {fresh(b).state.upper() for b in borrowers}
    weighed = [q for q in preempting if "pg_advisory_xact_lock" in q["sql"]]
    assert len(weighed) == 1  # by its placement; its preemption took that word for it
