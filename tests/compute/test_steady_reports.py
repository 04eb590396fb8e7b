"""The reports of a host where nothing happened take a short way (``compute.services.steady``,
the heartbeat's and the network report's ``_in_step``): they record the observation and
nothing else. Anything that differs, on the host's side or in the database, still takes the
full way, so no change is ever lost to the short one.

The short way's statements are PostgreSQL's: on the embedded SQLite every report takes the
full way, which records the same, so the tests that count them need PostgreSQL."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from compute import services
from compute.choices import VmState
from compute.models import Host, OrphanGuest, VirtualMachine
from compute.protocol import VM_APPLY_TASK
from network import services as network
from network.models import HostNetwork
from tests.compute.test_vms import fresh, report
from tests.factories import enroll_network, make_host, make_vm

pytestmark = pytest.mark.django_db

NOTHING = {"reissued": [], "settled": [], "orphans_destroyed": []}


def _guest(vm, power="running", cpu_time_ns=None):
    vm = fresh(vm)
    guest = {"vm_id": str(vm.pk), "generation": vm.generation, "power": power}
    if cpu_time_ns is not None:
        guest["cpu_time_ns"] = cpu_time_ns
    return guest


def _settled_vm(project):
    host = make_host()
    vm = make_vm(project)
    report(vm, "running")
    return host, fresh(vm)


def _reported(host, guests, at):
    return services.guests_reported(host=host.name, payload={"guests": guests}, sent_at=at)


@pytest.mark.postgres
def test_a_report_that_says_what_is_recorded_writes_the_observation_only(project, sent):
    host, vm = _settled_vm(project)
    assert vm.state == VmState.RUNNING
    at = timezone.now()
    before = len(sent)
    guests = [_guest(vm, cpu_time_ns=10**9)]
    with CaptureQueriesContext(connection) as queries:
        done = _reported(host, guests, at)
    assert done == NOTHING and len(sent) == before
    # The host's row with its VMs, the VMs' observation (in a savepoint here, in a test's
    # transaction: a transaction of its own in the controller).
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 2
    after = fresh(vm)
    assert after.updated_at == vm.updated_at  # nothing of the VM changed
    assert after.cpu_time_ns == 10**9 and after.cpu_sampled_at is not None
    assert after.power_observed_at is not None and after.active_at is not None
    assert Host.objects.get(pk=host.pk).guests_reported_at == at


def test_the_cpu_samples_follow_the_rule_of_the_full_comparison(project, sent):
    """Idle between two samples: ``active_at`` stays; busy: it moves (``reclaim``)."""
    host, vm = _settled_vm(project)
    t0 = timezone.now()
    _reported(host, [_guest(vm, cpu_time_ns=10**9)], t0)
    first = fresh(vm)
    _reported(host, [_guest(vm, cpu_time_ns=10**9)], t0 + timedelta(seconds=1))
    idle = fresh(vm)
    assert idle.active_at == first.active_at and idle.cpu_sampled_at > first.cpu_sampled_at
    busy_ns = 10**9 + vm.vcpus * 10**9 * 3600  # every vCPU busy for an hour
    _reported(host, [_guest(vm, cpu_time_ns=busy_ns)], t0 + timedelta(seconds=2))
    assert fresh(vm).active_at > idle.active_at


@pytest.mark.postgres
def test_each_guest_of_a_host_gets_its_own_sample(project, sent):
    """The short way writes a host's samples as one array per column, in one statement:
    each VM gets its own guest's, a guest that reports no CPU time included."""
    host = make_host()
    vms = [make_vm(project) for _ in range(3)]
    for vm in vms:
        report(vm, "running")
    vms = [fresh(vm) for vm in vms]
    assert {vm.host_id for vm in vms} == {host.pk}
    quiet, idle, busy = vms
    t0 = timezone.now()
    busy_ns = 10**9 + busy.vcpus * 10**9 * 3600  # every vCPU busy for an hour
    first = {idle.pk: 10**9, busy.pk: 10**9}
    then = {idle.pk: 10**9, busy.pk: busy_ns}
    for at, cpu in ((t0, first), (t0 + timedelta(seconds=1), then)):
        guests = [_guest(vm, cpu_time_ns=cpu.get(vm.pk)) for vm in vms]
        with CaptureQueriesContext(connection) as queries:
            assert _reported(host, guests, at) == NOTHING
        statements = [q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
        assert len(statements) == 2  # the short way: the host's row, the samples
    quiet, idle, busy = (fresh(vm) for vm in vms)
    assert quiet.cpu_time_ns is None and quiet.power_observed_at is not None
    assert idle.cpu_time_ns == 10**9 and busy.cpu_time_ns == busy_ns
    assert idle.cpu_sampled_at == busy.cpu_sampled_at is not None
    assert busy.active_at > idle.active_at


def test_a_change_in_the_database_is_not_lost_to_the_short_way(project, sent, settings):
    """The user stopped the VM and the message to the host was lost: the host still reports
    the guest running at the old generation, as it did before; the reconcile sends the
    stop again."""
    settings.RECONCILE_GRACE_S = 0
    host, vm = _settled_vm(project)
    unchanged = _guest(vm)
    assert _reported(host, [unchanged], timezone.now()) == NOTHING
    services.vm_stop(vm=fresh(vm))
    VirtualMachine.objects.filter(pk=vm.pk).update(updated_at=timezone.now() - timedelta(seconds=5))
    before = len(sent)
    done = _reported(host, [unchanged], timezone.now())
    assert done["reissued"] == [str(vm.pk)]
    assert [task for _, task, _ in sent[before:]] == [VM_APPLY_TASK]


def test_a_change_on_the_host_is_not_lost_to_the_short_way(project, sent):
    """The guest powered itself off: the VM is stopped."""
    host, vm = _settled_vm(project)
    done = _reported(host, [_guest(vm, power="shutoff")], timezone.now())
    assert done["settled"] == [str(vm.pk)]
    assert fresh(vm).state == VmState.STOPPED


def test_a_guest_no_vm_accounts_for_is_still_an_orphan(project, sent):
    host, vm = _settled_vm(project)
    stray = {"vm_id": "7d6c0b7e-0000-4000-8000-000000000002", "generation": 1, "power": "running"}
    _reported(host, [_guest(vm), stray], timezone.now())
    assert OrphanGuest.objects.filter(host=host, vm_id=stray["vm_id"]).exists()
    # While an orphan is on record, every report takes the full way (which forgets it once
    # the guest is gone).
    _reported(host, [_guest(vm)], timezone.now())
    assert not OrphanGuest.objects.filter(host=host).exists()


def test_a_vm_gone_from_the_host_in_the_database_makes_its_guest_an_orphan(project, sent):
    host, vm = _settled_vm(project)
    guest = _guest(vm)
    VirtualMachine.objects.filter(pk=vm.pk).update(host=None, state=VmState.ERROR)
    _reported(host, [guest], timezone.now())
    assert OrphanGuest.objects.filter(host=host, vm_id=guest["vm_id"]).exists()


def test_an_older_report_changes_nothing(project, sent):
    host, vm = _settled_vm(project)
    now = timezone.now()
    _reported(host, [_guest(vm, cpu_time_ns=5 * 10**9)], now)
    assert _reported(host, [_guest(vm, cpu_time_ns=10**9)], now - timedelta(1)) == NOTHING
    assert fresh(vm).cpu_time_ns == 5 * 10**9
    assert Host.objects.get(pk=host.pk).guests_reported_at == now


@pytest.mark.postgres
def test_a_heartbeat_that_says_still_here_moves_the_time_only(db):
    host = make_host()
    payload = {"version": "1", "libvirt_uri": "test:///default", "capabilities": ["compute"]}
    first = timezone.now()
    services.host_heartbeat_reported(host=host.name, payload=payload, sent_at=first)
    later = first + timedelta(seconds=10)
    with CaptureQueriesContext(connection) as queries:
        services.host_heartbeat_reported(host=host.name, payload=payload, sent_at=later)
    assert len(queries.captured_queries) == 1
    host.refresh_from_db()
    assert host.last_heartbeat_at == later and host.agent_version == "1"
    # An upgraded agent says so: recorded.
    services.host_heartbeat_reported(
        host=host.name, payload={**payload, "version": "2"}, sent_at=later + timedelta(1)
    )
    host.refresh_from_db()
    assert host.agent_version == "2"


def _net_payload(row, **changes):
    return {
        "vtep": row.vtep_address,
        "applied_generation": row.desired_generation,
        "ok": True,
        **changes,
    }


@pytest.mark.postgres
def test_a_network_report_of_a_converged_host_moves_the_time_only(db):
    host = make_host()
    row = enroll_network(host, "10.0.0.7")
    at = timezone.now() + timedelta(seconds=1)
    network.host_network_reported(host=host.name, payload=_net_payload(row), sent_at=at)
    row = HostNetwork.objects.get(host=host)
    assert row.converged
    later = at + timedelta(seconds=30)
    with CaptureQueriesContext(connection) as queries:
        network.host_network_reported(host=host.name, payload=_net_payload(row), sent_at=later)
    assert len(queries.captured_queries) == 1
    after = HostNetwork.objects.get(host=host)
    assert after.reported_at == later and after.applied_at == row.applied_at


def test_a_network_report_that_differs_takes_the_full_way(db, monkeypatch):
    from network import sync

    host = make_host()
    row = enroll_network(host, "10.0.0.7")
    at = timezone.now() + timedelta(seconds=1)
    network.host_network_reported(host=host.name, payload=_net_payload(row), sent_at=at)
    row = HostNetwork.objects.get(host=host)
    # A new MTU is recorded.
    network.host_network_reported(
        host=host.name, payload=_net_payload(row, underlay_mtu=9000), sent_at=at + timedelta(1)
    )
    assert HostNetwork.objects.get(host=host).underlay_mtu == 9000
    # An agent restarted says it applied nothing: it is sent its desired state again.
    sends = []
    monkeypatch.setattr(sync, "send_desired", lambda ids: sends.append(list(ids)))
    network.host_network_reported(
        host=host.name,
        payload=_net_payload(row, underlay_mtu=9000, applied_generation=0),
        sent_at=at + timedelta(2),
    )
    assert HostNetwork.objects.get(host=host).applied_generation == 0
    assert sends == [[host.pk]]
