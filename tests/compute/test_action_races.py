"""A user's action never fails because the controller's own transition happened at the same
moment (issue 13, fault 3): on PostgreSQL, the host's "running" report is held open in one
connection while the user's delete runs in another; the delete waits for it and wins."""

import threading

import pytest
from django.db import close_old_connections, connection, transaction

from compute import services
from compute.choices import PowerState, VmState
from compute.models import VirtualMachine
from compute.services import reconcile
from controlplane.errors import Conflict
from tests.factories import make_host, make_project, make_template, make_vm

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _observed_running(vm):
    return {
        "vm_id": str(vm.pk),
        "generation": vm.generation,
        "power": PowerState.RUNNING.value,
        "ok": True,
        "operation_id": "",
    }


def _hold_transition(vm, held: threading.Event, release: threading.Event, errors: list):
    """The controller's provisioning → running update, its transaction kept open until
    ``release`` is set."""
    try:
        with transaction.atomic():
            reconcile.vm_observed(
                host=vm.host.name, payload=_observed_running(vm), sent_at=vm.updated_at
            )
            held.set()
            release.wait(10)
    except Exception as e:  # pragma: no cover - shown in the assertion
        errors.append(repr(e))
        held.set()
    finally:
        close_old_connections()
        connection.close()


@pytest.mark.parametrize("action", ["delete", "stop"])
def test_an_action_waits_for_the_internal_transition_instead_of_failing(action):
    make_host("gpu-race")
    vm = make_vm(make_project(), template=make_template(gpus=1))
    assert vm.state == VmState.PROVISIONING
    stale = VirtualMachine.objects.select_related("project", "host").get(pk=vm.pk)
    held, release, errors = threading.Event(), threading.Event(), []
    controller = threading.Thread(target=_hold_transition, args=(vm, held, release, errors))
    controller.start()
    assert held.wait(10)
    # The user's request read the VM before the controller's update committed.
    timer = threading.Timer(0.5, release.set)
    timer.start()
    try:
        if action == "delete":
            vm, _op = services.vm_delete(vm=stale)
            assert vm.state == VmState.DELETING
        else:
            # stop is allowed once the VM is running: it must see the committed update.
            vm, _op = services.vm_stop(vm=stale)
            assert vm.state == VmState.RUNNING and vm.task_state == "stopping"
    finally:
        release.set()
        controller.join()
        timer.cancel()
    assert errors == []


def test_32_deletes_race_32_running_reports_and_none_answers_409():
    make_host("gpu-race-a")
    make_host("gpu-race-b")
    project = make_project()
    from tenants import services as tenants

    tenants.quota_set(project=project, vms=64, vcpus=4096, memory_gib=16384, gpus=64)
    template = make_template(gpus=0)
    vms = [make_vm(project, template=template) for _ in range(32)]
    barrier = threading.Barrier(64)
    conflicts, errors = [], []

    def run(fn):
        try:
            barrier.wait()
            fn()
        except Conflict as e:
            conflicts.append(e.message)
        except Exception as e:  # pragma: no cover - shown in the assertion
            errors.append(repr(e))
        finally:
            close_old_connections()
            connection.close()

    def report(vm):
        return lambda: reconcile.vm_observed(
            host=vm.host.name, payload=_observed_running(vm), sent_at=vm.updated_at
        )

    def delete(vm):
        return lambda: services.vm_delete(vm=vm)

    work = [report(vm) for vm in vms] + [delete(vm) for vm in vms]
    threads = [threading.Thread(target=run, args=(fn,)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and conflicts == []
    assert set(
        VirtualMachine.objects.filter(pk__in=[v.pk for v in vms]).values_list("state", flat=True)
    ) <= {VmState.DELETING, VmState.DELETED}
