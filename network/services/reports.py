"""What host agents report about their network: underlay, capabilities and the generation
they last applied.
"""

import logging

from django.db import transaction
from django.utils import timezone

from compute.models import Host
from network.models import HostNetwork
from network.services._common import _hosts_changed

log = logging.getLogger(__name__)


def host_network_reported(*, host: str, payload: dict, sent_at) -> None:
    """An agent's network report: its underlay, capabilities, and the generation it last
    applied (with the error, when the apply failed). A host behind what it should hold is
    sent its desired state again."""
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
            "underlay_device": payload.get("underlay_device", ""),
            "underlay_mtu": int(payload.get("underlay_mtu") or 1500),
            "gateway": bool(payload.get("gateway")),
            "external_bridge": payload.get("external_bridge", ""),
            "trunk_device": payload.get("trunk_device", ""),
            "sriov_pfs": payload.get("sriov_pfs") or {},
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
