"""Capacity freed asks for a scheduling pass (``KUMO_SCHEDULE_ON_RELEASE_S`` after the
release commits), so a VM waiting for it does not wait for beat's next pass; the releases
before that pass is due share it; 0 turns it off."""

import pytest
from django.core.cache import cache

from compute import placement, tasks
from compute.choices import Priority, VmState
from compute.protocol import SCHEDULE_PENDING_TASK
from tests.compute.test_vms import fresh, report
from tests.compute.test_vms import project as project
from tests.factories import make_host, make_template, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture
def published(monkeypatch):
    """The control tasks published (name, queue, countdown), host agents' work apart."""
    from controlplane.celery import app

    found = []

    def send_task(name, kwargs=None, queue=None, countdown=None, **_):
        if not queue.startswith("host."):
            found.append((name, queue, countdown))

    monkeypatch.setattr(app, "send_task", send_task)
    cache.delete(placement._PASS_ASKED)
    yield found
    cache.delete(placement._PASS_ASKED)


@pytest.fixture
def full_host(project):
    """An 8-GPU host full of two running 4-GPU on-demand VMs, and an 8-GPU spot VM waiting
    (a spot VM evicts nothing: it waits for room)."""
    make_host("gpu-a")
    four = make_template(gpus=4)
    running = [make_vm(project, template=four) for _ in range(2)]
    for vm in running:
        report(fresh(vm), "running")
    waiting = make_vm(project, template=make_template(gpus=8), priority=Priority.SPOT)
    assert fresh(waiting).state == VmState.PENDING
    return running, waiting


def _deleted(vm, commits):
    from compute import services

    with commits(execute=True):
        services.vm_delete(vm=fresh(vm))
        report(fresh(vm), "absent")  # the host's answer: its GPUs are released
    assert fresh(vm).state == VmState.DELETED


def test_a_release_asks_for_one_pass_which_places_the_waiting_vm(
    settings, published, full_host, django_capture_on_commit_callbacks
):
    settings.SCHEDULE_ON_RELEASE_S = 30.0  # (long: the second release comes well within it)
    (first, second), waiting = full_host
    _deleted(first, django_capture_on_commit_callbacks)
    assert published == [(SCHEDULE_PENDING_TASK, settings.CELERY_TASK_DEFAULT_QUEUE, 30.0)]
    _deleted(second, django_capture_on_commit_callbacks)  # before that pass: it shares it
    assert len(published) == 1

    assert tasks.vms_schedule_pending() == 1  # the pass asked for, as a worker runs it
    assert fresh(waiting).state == VmState.PROVISIONING


def test_none_is_asked_when_turned_off(
    settings, published, full_host, django_capture_on_commit_callbacks
):
    settings.SCHEDULE_ON_RELEASE_S = 0
    (first, _), waiting = full_host
    _deleted(first, django_capture_on_commit_callbacks)
    assert published == []
    assert fresh(waiting).state == VmState.PENDING  # until beat's pass
