"""Hosts: enrolment by heartbeat, down detection, recovery, operator states, ping."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from compute import services
from compute.choices import HostState
from compute.models import Host
from controlplane.errors import Conflict, InvalidInput
from controlplane.models import AuditEvent, Operation

pytestmark = pytest.mark.django_db

PAYLOAD = {"version": "0.1.0", "libvirt_uri": "test:///default", "capabilities": ["controlplane"]}


def beat(name="gpu-01", at=None):
    return services.host_heartbeat(host=name, payload=PAYLOAD, sent_at=at or timezone.now())


def test_first_heartbeat_enrolls_the_host_up():
    host = beat()
    assert host.state == HostState.UP
    assert host.libvirt_uri == "test:///default"
    assert AuditEvent.objects.filter(action="host.enroll", object_id=str(host.pk)).count() == 1


def test_a_late_heartbeat_changes_nothing():
    now = timezone.now()
    beat(at=now)
    host = beat(at=now - timedelta(seconds=5))
    assert host.last_heartbeat_at == now


@pytest.mark.postgres
def test_a_still_here_heartbeat_is_one_update_and_anything_else_takes_the_full_path(
    django_assert_num_queries, settings
):
    """The report handler: a heartbeat that only says "still here" is one UPDATE; a down
    host, a restarted or upgraded agent, or a late heartbeat goes through host_heartbeat.
    The UPDATE is PostgreSQL's: on the embedded SQLite every heartbeat takes the full path."""
    settings.HOST_HEARTBEAT_TIMEOUT_S = 30
    start = datetime(2026, 11, 1, tzinfo=UTC)
    report = services.host_heartbeat_reported
    report(host="gpu-01", payload=PAYLOAD, sent_at=start)  # enrolls: the full path
    with django_assert_num_queries(1):
        report(host="gpu-01", payload=PAYLOAD, sent_at=start + timedelta(seconds=10))
    assert Host.objects.get(name="gpu-01").last_heartbeat_at == start + timedelta(seconds=10)

    report(host="gpu-01", payload=PAYLOAD, sent_at=start + timedelta(seconds=5))  # late
    assert Host.objects.get(name="gpu-01").last_heartbeat_at == start + timedelta(seconds=10)

    upgraded = {**PAYLOAD, "version": "0.2.0", "started_at": "2026-11-01T00:00:20+00:00"}
    report(host="gpu-01", payload=upgraded, sent_at=start + timedelta(seconds=20))
    host = Host.objects.get(name="gpu-01")
    assert host.agent_version == "0.2.0" and host.agent_started_at is not None
    with django_assert_num_queries(1):  # and from then on, "still here" again
        report(host="gpu-01", payload=upgraded, sent_at=start + timedelta(seconds=25))

    assert services.hosts_check(now=start + timedelta(seconds=60)) == ["gpu-01"]
    report(host="gpu-01", payload=upgraded, sent_at=start + timedelta(seconds=70))
    assert Host.objects.get(name="gpu-01").state == HostState.UP  # back, by the full path
    assert AuditEvent.objects.filter(action="host.up").count() == 1


def test_silent_host_goes_down_and_comes_back_by_itself(settings):
    settings.HOST_HEARTBEAT_TIMEOUT_S = 30
    start = datetime(2026, 11, 1, tzinfo=UTC)
    beat("gpu-01", at=start)
    beat("gpu-02", at=start + timedelta(seconds=50))
    assert services.hosts_check(now=start + timedelta(seconds=60)) == ["gpu-01"]
    assert Host.objects.get(name="gpu-01").state == HostState.DOWN
    assert "no heartbeat since" in Host.objects.get(name="gpu-01").state_reason
    assert Host.objects.get(name="gpu-02").state == HostState.UP
    assert services.hosts_check(now=start + timedelta(seconds=60)) == []  # once only

    beat("gpu-01", at=start + timedelta(seconds=70))
    assert Host.objects.get(name="gpu-01").state == HostState.UP
    assert AuditEvent.objects.filter(action="host.down").count() == 1
    assert AuditEvent.objects.filter(action="host.up").count() == 1


def test_operator_states_survive_heartbeats_and_return_to_service():
    host = beat()
    services.host_set_state(host=host, state=HostState.MAINTENANCE, reason="DIMM swap")
    beat()
    assert Host.objects.get(pk=host.pk).state == HostState.MAINTENANCE
    services.host_set_state(host=host, state=HostState.UP)
    assert Host.objects.get(pk=host.pk).state == HostState.UP


def test_illegal_state_changes_are_refused():
    host = beat()
    with pytest.raises(Conflict, match="only a draining or maintenance host"):
        services.host_set_state(host=host, state=HostState.UP)
    with pytest.raises(InvalidInput):
        services.host_set_state(host=host, state=HostState.DOWN)


def test_ping_creates_an_operation_and_sends_after_commit(django_capture_on_commit_callbacks):
    host = beat()
    with django_capture_on_commit_callbacks() as callbacks:
        operation = services.host_ping(host=host)
    assert len(callbacks) == 1  # the message leaves only once the operation is committed
    assert Operation.objects.get(pk=operation.pk).state == "pending"
    assert operation.kind == "host.ping" and operation.target_id == str(host.pk)
