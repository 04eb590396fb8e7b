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
