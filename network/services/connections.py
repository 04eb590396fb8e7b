"""External connections: a project asks for a link to an outside network (an L2VPN on a
VLAN, or an L3 route) and an operator approves or rejects it; only an approved one is
realized, on the gateway host.
"""

import ipaddress

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from network.choices import ConnectionKind, ConnectionState
from network.models import ExternalConnection, Network
from network.services._common import _hosts_changed
from network.services.nat import router_ensure
from tenants.models import Project


@transaction.atomic
def connection_request(
    *,
    project: Project,
    name: str,
    kind: str,
    network: Network | None = None,
    vlan_id: int | None = None,
    destination_cidr: str = "",
    next_hop: str | None = None,
    remote: str = "",
) -> ExternalConnection:
    """Ask the operators for a link to an outside network; nothing is realized before
    they approve it."""
    if kind == ConnectionKind.L2VPN and (network is None or vlan_id is None):
        raise InvalidInput.field("vlan_id", "an L2VPN needs a network and a VLAN id")
    if kind == ConnectionKind.L3_ROUTE:
        if not destination_cidr or not next_hop:
            raise InvalidInput.field("next_hop", "an L3 route needs destination_cidr and next_hop")
        try:
            destination_cidr = str(ipaddress.IPv4Network(destination_cidr, strict=True))
        except ValueError as e:
            raise InvalidInput.field("destination_cidr", str(e)) from e
    if network is not None and network.project_id != project.pk:
        raise InvalidInput.field("network", "no such network in this project")
    if ExternalConnection.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a connection named {name} exists", details={"name": ["taken"]})
    connection = ExternalConnection.objects.create(
        project=project,
        name=name,
        kind=kind,
        network=network,
        vlan_id=vlan_id,
        destination_cidr=destination_cidr,
        next_hop=next_hop,
        remote=remote,
    )
    audit.record("external_connection.request", connection, project=project)
    return connection


@transaction.atomic
def connection_review(
    *, connection: ExternalConnection, approve: bool, note: str = "", actor=None
) -> ExternalConnection:
    """An operator approves (realized on the gateway host) or rejects a request. The row
    is locked first, so two operators reviewing at once cannot both win."""
    connection = ExternalConnection.objects.select_for_update().get(pk=connection.pk)
    if connection.state != ConnectionState.REQUESTED:
        raise Conflict(
            f"connection {connection.name} is {connection.state} already",
            code="invalid_state",
            details={"state": [connection.state]},
        )
    connection.state = ConnectionState.APPROVED if approve else ConnectionState.REJECTED
    connection.review_note = note
    connection.reviewed_by = actor if getattr(actor, "is_authenticated", False) else None
    connection.reviewed_at = timezone.now()
    if approve and connection.kind == ConnectionKind.L3_ROUTE:
        router_ensure(connection.project)
    if approve and connection.kind == ConnectionKind.L2VPN:
        from network.desired import gateway_host

        gateway = gateway_host()
        if gateway is None or not gateway.trunk_device:
            raise Conflict(
                "no gateway host reports a trunk device to carry the VLAN; configure "
                "KUMO_NETWORK_TRUNK_DEVICE on the gateway's agent first",
                code="unavailable",
                details={"vlan_id": ["no trunk on the gateway"]},
            )
    try:
        with transaction.atomic():
            connection.save()
    except IntegrityError as e:  # unique_approved_l2vpn_vlan
        raise Conflict(
            f"VLAN {connection.vlan_id} carries another approved L2VPN",
            code="in_use",
            details={"vlan_id": ["in use"]},
        ) from e
    audit.record(
        f"external_connection.{'approve' if approve else 'reject'}",
        connection,
        project=connection.project,
        detail={"note": note},
    )
    if approve:
        _hosts_changed(project=connection.project)
    return connection


@transaction.atomic
def connection_delete(*, connection: ExternalConnection) -> None:
    audit.record("external_connection.delete", connection, project=connection.project)
    was_live = connection.state == ConnectionState.APPROVED
    project = connection.project
    connection.delete()
    if was_live:
        _hosts_changed(project=project)
