"""What host agents report about their network: underlay, capabilities and the generation
they last applied.
"""

import json
import logging

from django.db import connection, transaction
from django.utils import timezone

from compute.models import Host
from network.models import HostNetwork
from network.services._common import _hosts_changed

log = logging.getLogger(__name__)


def host_network_reported(*, host: str, payload: dict, sent_at) -> None:
    """An agent's network report: its underlay, capabilities, and the generation it last
    applied (with the error, when the apply failed). A host behind what it should hold is
    sent its desired state again.

    A report that says what is recorded, from a host that holds what it should, moves
    ``reported_at`` in one conditional UPDATE (``_in_step``); any other goes the full way."""
    if _in_step(host, payload, sent_at):
        return
    with transaction.atomic():
        target = Host.objects.filter(name=host).first()
        if target is None:
            log.info("network report from unknown host %s; it enrolls by heartbeat", host)
            return
        row, _ = HostNetwork.objects.select_for_update().get_or_create(host=target)
        if row.reported_at is not None and sent_at <= row.reported_at:
            return  # older than the report recorded: it says nothing new
        fields = {
            "vtep_address": payload.get("vtep") or None,
            **_host_fields(payload),
            "reported_at": sent_at,
        }
        # The agent's word is the truth: one that restarted has applied nothing yet and
        # says 0, which makes the controller send it everything again.
        applied = int(payload.get("applied_generation") or 0)
        if applied != row.applied_generation:
            fields["applied_generation"] = applied
            fields["applied_at"] = timezone.now()
        fields["last_error"] = "" if payload.get("ok", True) else str(payload.get("error"))[:500]
        gateway_changed = fields["gateway"] != row.gateway
        for name, value in fields.items():
            setattr(row, name, value)
        row.save()
        if gateway_changed:
            _hosts_changed(project=None)
        # A report taken before the host's desired state last changed is behind by
        # construction: that change sent the new state itself, so nothing is sent again.
        behind = not row.converged and (row.desired_at is None or sent_at >= row.desired_at)
    if behind:
        from network import sync

        sync.send_desired([target.pk])


def _host_fields(payload: dict) -> dict:
    """What a network report says of its host's set-up, as ``HostNetwork`` fields (raises
    ``TypeError``/``ValueError`` on a malformed MTU)."""
    return {
        "underlay_device": payload.get("underlay_device", ""),
        "underlay_mtu": int(payload.get("underlay_mtu") or 1500),
        "gateway": bool(payload.get("gateway")),
        "external_bridge": payload.get("external_bridge", ""),
        "trunk_device": payload.get("trunk_device", ""),
        "sriov_pfs": payload.get("sriov_pfs") or {},
    }


def _in_step(host: str, payload: dict, sent_at) -> bool:
    """Record the report in one statement if it changes nothing but ``reported_at``: the
    host's row exists and is older, holds every field as the report says, and the host has
    applied (without error) the generation it should hold. The full handler would then
    only save the same values and send nothing."""
    try:
        same = {
            **_host_fields(payload),
            "applied_generation": int(payload.get("applied_generation") or 0),
        }
    except (TypeError, ValueError):
        return False  # the full handler says what is wrong with it
    if not payload.get("ok", True) or connection.vendor != "postgresql":
        return False  # (the statement is PostgreSQL's: elsewhere the full handler runs)
    with connection.cursor() as cursor:
        cursor.execute(
            _IN_STEP,
            [
                *(sent_at, host, sent_at, payload.get("vtep") or None),
                *(same["underlay_device"], same["underlay_mtu"], same["gateway"]),
                *(same["external_bridge"], same["trunk_device"], json.dumps(same["sriov_pfs"])),
                same["applied_generation"],
            ],
        )
        return cursor.rowcount > 0


# Written out: the ORM takes longer to build it than PostgreSQL to run it, and a fleet sends
# hundreds a second.
_IN_STEP = f"""
UPDATE {HostNetwork._meta.db_table} SET reported_at = %s
WHERE host_id = (SELECT id FROM {Host._meta.db_table} WHERE name = %s)
  AND reported_at < %s AND vtep_address IS NOT DISTINCT FROM %s::inet
  AND underlay_device = %s AND underlay_mtu = %s AND gateway = %s AND external_bridge = %s
  AND trunk_device = %s AND sriov_pfs = %s::jsonb AND applied_generation = %s
  AND applied_generation >= desired_generation AND last_error = ''
"""
