"""Writes to hosts: heartbeats in, liveness checks, operator labels and states, pings out."""

import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from compute.choices import OPERATOR_STATES, HostState, PowerState, VmState
from compute.models import Host, VirtualMachine
from controlplane import agents, audit
from controlplane.errors import Conflict, InvalidInput
from controlplane.services import operation_create

log = logging.getLogger(__name__)

PING_TASK = "kumo.host.agent.ping"


def host_heartbeat_reported(*, host: str, payload: dict, sent_at: datetime) -> None:
    """The heartbeat report's handler. A heartbeat that only says "still here" (the host is
    enrolled and not down, and its agent's version, start, libvirt URI and capabilities are
    what Kumo has) moves ``last_heartbeat_at`` in one conditional UPDATE; anything else (a new
    host, a host coming back, an agent restarted or upgraded, a late heartbeat) is
    ``host_heartbeat``'s, unchanged. A fleet's hosts send these all the time, almost all of
    them of the first kind, so that one is written out (the ORM takes longer to build it
    than PostgreSQL to run it)."""
    if connection.vendor != "postgresql":  # the statement is PostgreSQL's
        host_heartbeat(host=host, payload=payload, sent_at=sent_at)
        return
    version, uri, capabilities, started = _heartbeat_fields(payload)
    with connection.cursor() as cursor:
        cursor.execute(
            _STILL_HERE,
            [
                *(sent_at, timezone.now(), host, version, uri, json.dumps(capabilities)),
                *(started, HostState.ENROLLING, HostState.DOWN, sent_at),
            ],
        )
        still_here = cursor.rowcount
    if not still_here:
        host_heartbeat(host=host, payload=payload, sent_at=sent_at)


_STILL_HERE = f"""
UPDATE {Host._meta.db_table} SET last_heartbeat_at = %s, updated_at = %s
WHERE name = %s AND agent_version = %s AND libvirt_uri = %s AND capabilities = %s::jsonb
  AND agent_started_at IS NOT DISTINCT FROM %s AND state NOT IN (%s, %s)
  AND (last_heartbeat_at IS NULL OR last_heartbeat_at < %s)
"""


def _heartbeat_fields(payload: dict):
    """What a heartbeat says of its agent: version, libvirt URI, capabilities, start."""
    started = payload.get("started_at")
    return (
        str(payload.get("version", ""))[:32],
        str(payload.get("libvirt_uri", ""))[:255],
        list(payload.get("capabilities", [])),
        parse_datetime(started) if isinstance(started, str) else None,
    )


@transaction.atomic
def host_heartbeat(*, host: str, payload: dict, sent_at: datetime) -> Host:
    """Record a heartbeat: creates the host on its first one, brings a down host back up.

    A heartbeat older than the last one recorded (delivered late) changes nothing.
    """
    obj, created = Host.objects.select_for_update().get_or_create(name=host)
    if obj.last_heartbeat_at is not None and sent_at <= obj.last_heartbeat_at:
        return obj
    previous = obj.state
    obj.last_heartbeat_at = sent_at
    obj.agent_version, obj.libvirt_uri, obj.capabilities, obj.agent_started_at = _heartbeat_fields(
        payload
    )
    if obj.state in (HostState.ENROLLING, HostState.DOWN):
        obj.state, obj.state_reason = HostState.UP, ""
    obj.save()
    if created or previous != obj.state:
        audit.record(
            "host.up" if not created else "host.enroll",
            obj,
            detail={"from": previous, "to": obj.state, "agent_version": obj.agent_version},
        )
        log.info("host %s: %s -> %s", obj.name, previous, obj.state)
    return obj


def hosts_check(*, now: datetime | None = None) -> list[str]:
    """Mark down every up or draining host whose agent missed heartbeats; returns their names."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.HOST_HEARTBEAT_TIMEOUT_S)
    names = []
    stale = Host.objects.filter(
        state__in=[HostState.UP, HostState.DRAINING], last_heartbeat_at__lt=cutoff
    ).values_list("pk", flat=True)
    for pk in list(stale):
        with transaction.atomic():
            host = Host.objects.select_for_update().get(pk=pk)
            if (
                host.state not in (HostState.UP, HostState.DRAINING)
                or host.last_heartbeat_at >= cutoff
            ):
                continue  # a heartbeat came in meanwhile
            previous, host.state = host.state, HostState.DOWN
            host.state_reason = f"no heartbeat since {host.last_heartbeat_at:%Y-%m-%d %H:%M:%S} UTC"
            host.save(update_fields=["state", "state_reason", "updated_at"])
            audit.record("host.down", host, detail={"from": previous, "reason": host.state_reason})
            # What runs there is unknown until its agent reports again.
            VirtualMachine.objects.filter(host=host).exclude(state=VmState.DELETED).update(
                power_state=PowerState.UNKNOWN, updated_at=now
            )
            log.warning("host %s marked down: %s", host.name, host.state_reason)
            from compute import guarantees

            guarantees.guarantees_check(cause=f"host {host.name} is down")
            names.append(host.name)
    return names


@transaction.atomic
def host_update(
    *,
    host: Host,
    rack: str | None = None,
    zone: str | None = None,
    cpu_allocation_ratio: float | None = None,
    ram_allocation_ratio: float | None = None,
) -> Host:
    """An operator labels a host (rack, zone) or sets its overcommit ratios. Lowering a
    ratio below what is already placed is refused: it would strand running VMs."""
    host = Host.objects.select_for_update().get(pk=host.pk)
    changes = {
        k: v
        for k, v in {
            "rack": rack,
            "zone": zone,
            "cpu_allocation_ratio": cpu_allocation_ratio,
            "ram_allocation_ratio": ram_allocation_ratio,
        }.items()
        if v is not None and getattr(host, k) != v
    }
    for name, value in changes.items():
        setattr(host, name, value)
    if host.vcpus_capacity < host.vcpus_used:
        raise Conflict(
            f"host {host.name} has {host.vcpus_used} vCPUs placed; a ratio of "
            f"{host.cpu_allocation_ratio} allows only {host.vcpus_capacity}",
            details={"cpu_allocation_ratio": ["below what is already placed"]},
        )
    if host.memory_mib_capacity < host.memory_mib_used:
        raise Conflict(
            f"host {host.name} has {host.memory_mib_used} MiB placed; a ratio of "
            f"{host.ram_allocation_ratio} allows only {host.memory_mib_capacity}",
            details={"ram_allocation_ratio": ["below what is already placed"]},
        )
    if changes:
        host.save(update_fields=[*changes, "updated_at"])
        audit.record("host.update", host, detail={k: str(v) for k, v in changes.items()})
        from compute import placement

        transaction.on_commit(placement.view.invalidate, robust=True)
    return host


@transaction.atomic
def host_set_state(*, host: Host, state: str, reason: str = "") -> Host:
    """An operator drains a host, puts it into maintenance, or returns it to service."""
    if state not in (*OPERATOR_STATES, HostState.UP):
        raise InvalidInput.field("state", "must be draining, maintenance or up")
    host = Host.objects.select_for_update().get(pk=host.pk)
    if state == HostState.UP and host.state not in OPERATOR_STATES:
        raise Conflict(
            f"host {host.name} is {host.state}; only a draining or maintenance host "
            "is returned to service",
            details={"state": [host.state]},
        )
    if host.state == HostState.DOWN and state == HostState.DRAINING:
        raise Conflict(f"host {host.name} is down", details={"state": [host.state]})
    if host.state != state:
        previous, host.state, host.state_reason = host.state, state, reason[:200]
        host.save(update_fields=["state", "state_reason", "updated_at"])
        audit.record(
            "host.set_state", host, detail={"from": previous, "to": state, "reason": reason}
        )
        if state != HostState.UP:
            from compute import guarantees

            guarantees.guarantees_check(cause=f"host {host.name} is {state}")
    return host


@transaction.atomic
def host_ping(*, host: Host, actor=None):
    """Ask the host's agent to answer: returns the operation that will hold its answer."""
    operation = operation_create(kind="host.ping", target=host, created_by=actor, deadline_s=60)
    audit.record("host.ping", host, detail={"operation": str(operation.pk)})
    agents.send_to_host(host.name, PING_TASK, operation_id=str(operation.pk))
    return operation
