"""Networks and their subnets: a network with a VNI of its own, a subnet with its gateway,
address pool and DNS servers.
"""

import ipaddress

from django.conf import settings
from django.db import transaction

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from network import allocation
from network.choices import NetworkKind
from network.drivers.base import overlay_mtu
from network.models import FixedIp, Network, Port, Subnet
from network.services._common import _address_in, _hosts_changed, _parse_cidr, _require_rdma_capable
from network.services.nat import router_ensure
from network.services.security_groups import default_security_group
from tenants import quotas
from tenants.models import Project


@transaction.atomic
def network_create(
    *,
    project: Project,
    name: str,
    kind: str = NetworkKind.OVERLAY,
    description: str = "",
    external_access: bool = False,
    cidr: str = "",
    rdma_dscp: int | None = None,
    rdma_ecn: bool | None = None,
    rdma_pfc_priority: int | None = None,
) -> Network:
    """A network with a VNI of its own (409 when the VNI range is used up) and, when
    ``cidr`` is given, its first subnet. The project's ``default`` security group is made
    with its first network."""
    if kind == NetworkKind.RDMA:
        _require_rdma_capable()
    if Network.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a network named {name} exists", details={"name": ["taken"]})
    quotas.check(project, networks=1)
    qos = {
        k: v
        for k, v in {
            "rdma_dscp": rdma_dscp,
            "rdma_ecn": rdma_ecn,
            "rdma_pfc_priority": rdma_pfc_priority,
        }.items()
        if v is not None
    }
    taken = set(Network.objects.values_list("vni", flat=True))
    network = allocation.claim(
        allocation.free_vnis(taken),
        lambda vni: Network.objects.create(
            project=project,
            name=name,
            kind=kind,
            description=description,
            external_access=external_access,
            vni=vni,
            mtu=overlay_mtu(settings.UNDERLAY_MTU),
            **qos,
        ),
        exhausted="no VXLAN network identifier is free: the VNI range is used up",
    )
    default_security_group(project)
    if external_access:
        router_ensure(project)
    audit.record(
        "network.create",
        network,
        project=project,
        detail={"vni": network.vni, "kind": kind, "mtu": network.mtu},
    )
    if cidr:
        subnet_create(network=network, cidr=cidr)
    return network


@transaction.atomic
def network_update(*, network: Network, **changes) -> Network:
    """Change ``description`` or ``external_access``."""
    allowed = {"description", "external_access"}
    unknown = set(changes) - allowed
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "cannot be changed")
    for field, value in changes.items():
        setattr(network, field, value)
    network.save(update_fields=list(changes))
    if network.external_access:
        router_ensure(network.project)
    audit.record("network.update", network, project=network.project, detail=changes)
    _hosts_changed(project=network.project)
    return network


@transaction.atomic
def network_delete(*, network: Network) -> None:
    """Delete a network without ports (409 while any port is on it)."""
    ports = Port.objects.filter(network=network).count()
    if ports:
        raise Conflict(
            f"network {network.name} still has {ports} port(s); delete them first",
            code="in_use",
            details={"ports": [str(ports)]},
        )
    project = network.project
    audit.record("network.delete", network, project=project, detail={"vni": network.vni})
    network.delete()
    _hosts_changed(project=project)


@transaction.atomic
def subnet_create(
    *,
    network: Network,
    cidr: str,
    name: str = "",
    gateway_ip: str | None = "",
    pool_start: str = "",
    pool_end: str = "",
    dns_servers: list[str] | None = None,
) -> Subnet:
    """A subnet; the gateway defaults to the first host address (None: no gateway) and the
    pool to every other host address. Overlapping another subnet of the network is 400."""
    net = _parse_cidr(cidr)
    Network.objects.select_for_update().filter(pk=network.pk).first()  # serialize overlaps
    for other in Subnet.objects.filter(network=network).values_list("cidr", flat=True):
        if net.overlaps(ipaddress.IPv4Network(other)):
            raise InvalidInput.field("cidr", f"{net} overlaps subnet {other} of this network")
    hosts = list(net.hosts())
    if gateway_ip == "":
        gateway_ip = str(hosts[0])
    elif gateway_ip is not None:
        gateway_ip = _address_in("gateway_ip", gateway_ip, net)
    start = _address_in("pool_start", pool_start, net) if pool_start else None
    end = _address_in("pool_end", pool_end, net) if pool_end else str(hosts[-1])
    if start is None:
        start = str(hosts[1] if gateway_ip == str(hosts[0]) else hosts[0])
    if ipaddress.IPv4Address(start) > ipaddress.IPv4Address(end):
        raise InvalidInput.field("pool_end", f"the pool ends at {end}, before it starts")
    servers = _dns_servers(dns_servers)
    subnet = Subnet.objects.create(
        project=network.project,
        network=network,
        name=name,
        cidr=str(net),
        gateway_ip=gateway_ip,
        pool_start=start,
        pool_end=end,
        dns_servers=servers,
    )
    audit.record("subnet.create", subnet, project=network.project, detail={"network": network.name})
    _hosts_changed(project=network.project)
    return subnet


def _dns_servers(servers: list[str] | None) -> list[str]:
    found = []
    for server in servers or []:
        try:
            found.append(str(ipaddress.IPv4Address(server)))
        except ValueError as e:
            raise InvalidInput.field("dns_servers", f"{server!r} is not an IPv4 address") from e
    if len(found) > 4:
        raise InvalidInput.field("dns_servers", "at most 4 servers")
    return found


@transaction.atomic
def subnet_update(*, subnet: Subnet, dns_servers: list[str]) -> Subnet:
    """Set the DNS servers the subnet's guests are told (``[]``: the network's own
    resolver, ``network.dns``). Guests read it when their VM is next applied (created,
    started, rebuilt); running guests keep what they were told."""
    subnet.dns_servers = _dns_servers(dns_servers)
    subnet.save(update_fields=["dns_servers"])
    audit.record(
        "subnet.update", subnet, project=subnet.project, detail={"dns_servers": subnet.dns_servers}
    )
    return subnet


@transaction.atomic
def subnet_delete(*, subnet: Subnet) -> None:
    used = FixedIp.objects.filter(subnet=subnet).count()
    if used:
        raise Conflict(
            f"subnet {subnet.cidr} has {used} address(es) in use",
            code="in_use",
            details={"fixed_ips": [str(used)]},
        )
    audit.record("subnet.delete", subnet, project=subnet.project)
    subnet.delete()
    _hosts_changed(project=subnet.project)
