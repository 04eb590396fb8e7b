"""What the network services share: which hosts a change touches (``_hosts_changed``), the
parsing of CIDRs and host addresses, and the check that RDMA networks can be offered.
"""

import ipaddress

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane.errors import Conflict, InvalidInput
from network.models import HostNetwork, Port
from tenants.models import Project


def _hosts_changed(*, project: Project | None = None, host_ids=(), gateway: bool = True) -> None:
    """Bump the desired generation of every host holding ``project``'s ports, of
    ``host_ids``, and of the gateway hosts; send them their state after commit.

    A project's networks, security groups and NAT only ever concern the hosts with its
    ports and the gateway hosts, so this is exact enough: a host told to resync with
    nothing to change writes nothing.
    """
    ids = set(host_ids)
    if project is not None:
        ids |= set(
            Port.objects.for_project(project)
            .filter(host__isnull=False)
            .values_list("host_id", flat=True)
            .distinct()
        )
    wanted = Q(host_id__in=ids)
    if gateway:
        wanted |= Q(gateway=True)
    changed = list(HostNetwork.objects.filter(wanted).values_list("host_id", flat=True))
    if not changed:
        return
    HostNetwork.objects.filter(host_id__in=changed).update(
        desired_generation=F("desired_generation") + 1, desired_at=timezone.now()
    )

    def send():
        from network import sync

        sync.send_desired(changed)

    transaction.on_commit(send, robust=True)


def _require_rdma_capable() -> None:
    if not HostNetwork.objects.exclude(sriov_pfs={}).exists():
        raise Conflict(
            "no host has an RDMA NIC with SR-IOV virtual functions reported by its network "
            "agent, so RDMA networks cannot be offered",
            code="rdma_unavailable",
            details={"kind": ["no host reports SR-IOV RDMA NICs"]},
        )


def _parse_cidr(cidr: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as e:
        raise InvalidInput.field("cidr", f"{cidr!r} is not an IPv4 network: {e}") from e
    if net.prefixlen > 29:
        raise InvalidInput.field("cidr", "the prefix must be /29 or shorter")
    return net


def _address_in(field: str, value: str, net: ipaddress.IPv4Network) -> str:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError as e:
        raise InvalidInput.field(field, f"{value!r} is not an IPv4 address") from e
    if address not in net or address in (net.network_address, net.broadcast_address):
        raise InvalidInput.field(field, f"{value} is not a host address of {net}")
    return str(address)
