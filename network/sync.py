"""Sending hosts their desired network state.

``send_desired`` publishes, for each host, the whole ``HostNetworks`` it should hold and
the generation it belongs to. Nothing here changes the database: the generations were
bumped by the service that changed the state, and the agent's report records what it
applied, so a publish that is lost is simply done again by ``send_unconverged``.
"""

import logging

from controlplane import agents
from network import desired, protocol
from network.models import HostNetwork

log = logging.getLogger(__name__)


def send_desired(host_ids) -> int:
    """Send each host with a network agent its desired state now; returns how many."""
    sent = 0
    rows = HostNetwork.objects.filter(host_id__in=list(host_ids), vtep_address__isnull=False)
    for row in rows.select_related("host"):
        state = desired.host_networks(row.host_id)
        agents.send_to_host(
            row.host.name,
            protocol.NETWORK_APPLY_TASK,
            generation=row.desired_generation,
            desired=protocol.to_wire(state),
        )
        log.info(
            "network state of %s generation %d sent: %d networks, %d ports, %d routers",
            row.host.name,
            row.desired_generation,
            len(state.networks),
            len(state.ports),
            len(state.routers),
        )
        sent += 1
    return sent


def send_unconverged() -> int:
    """Send again to every host that has not reported its desired generation applied."""
    from django.db.models import F

    behind = HostNetwork.objects.filter(
        applied_generation__lt=F("desired_generation"), vtep_address__isnull=False
    ).values_list("host_id", flat=True)
    return send_desired(list(behind))
