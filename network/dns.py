"""The projects' names: which networks have a resolver, what it answers, and what guests
are told.

Every overlay network with a subnet that has a gateway gets a resolver with no setting: a
dnsmasq on the gateway host (``network.drivers.dns``) answering at each subnet's gateway
address. It answers the project's VM names as ``<vm>.<project slug>.<KUMO_DNS_DOMAIN>``
(``web.alpha.internal``), and guests get ``<project slug>.<KUMO_DNS_DOMAIN>`` as their
search domain, so the bare ``web`` resolves too; every other name is forwarded to
``KUMO_DNS_UPSTREAM``. A subnet's own ``dns_servers``, when set, replace the resolver in
what its guests are told (the resolver keeps running for whoever asks it).

Names are per project: a network's resolver holds only its own project's names, and the
whole internal domain is local to it, so another project's names answer NXDOMAIN.
"""

import hashlib
import ipaddress
import re
from collections import defaultdict

from django.conf import settings

from network.choices import NetworkKind
from network.drivers.base import DnsService

_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def zone(project_slug: str) -> str:
    """The project's DNS zone: ``<slug>.<KUMO_DNS_DOMAIN>``."""
    return f"{project_slug}.{settings.DNS_DOMAIN}"


def dns_mac(network_id: str) -> str:
    """The MAC of a network's own DNS namespace's leg: derived from the network, so it
    never changes and needs no allocation (locally administered, prefix 02:4b:44)."""
    digest = hashlib.sha256(f"dns:{network_id}".encode()).digest()
    return "02:4b:44:" + ":".join(f"{b:02x}" for b in digest[:3])


def has_resolver(subnet, network) -> bool:
    """Whether ``subnet`` of ``network`` has Kumo's resolver: an overlay network (an RDMA
    network's VFs bypass the bridges) and a gateway address to answer on."""
    return network.kind == NetworkKind.OVERLAY and bool(subnet.gateway_ip)


def guest_dns(subnet, network, project_slug: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a guest with an address on ``subnet`` is told: (servers, search domains). The
    subnet's own ``dns_servers`` when set; else its resolver (the gateway address) and the
    project's zone as search domain; else nothing."""
    if subnet.dns_servers:
        servers = tuple(subnet.dns_servers)
        search = (zone(project_slug),) if subnet.gateway_ip in servers else ()
        return servers, search
    if has_resolver(subnet, network):
        return (subnet.gateway_ip,), (zone(project_slug),)
    return (), ()


def services(subnets, routers: dict, records) -> tuple[DnsService, ...]:
    """The resolvers of ``subnets`` (those with a resolver, network and project loaded):
    one per network, in its project's router (``routers``: {project id: router id hex})
    when it has one. ``records`` are (project id, network id, address, VM name, port name)
    of every address of those projects: a VM's name resolves to its addresses on the
    resolver's network, or to all of them when it has none there; a port of no VM is
    named by its own name when it has one."""
    by_network = defaultdict(list)
    for subnet in subnets:
        by_network[subnet.network].append(subnet)
    names = defaultdict(lambda: defaultdict(list))  # project -> name -> [(network, address)]
    for project_id, network_id, address, vm_name, port_name in records:
        name = vm_name or port_name
        if name and _HOSTNAME.match(name):
            names[project_id][name].append((network_id, address))
    result = []
    for network, subnets_of in sorted(by_network.items(), key=lambda item: item[0].vni):
        hosts = set()
        for name, places in names[network.project_id].items():
            here = [a for n, a in places if n == network.pk] or [a for _, a in places]
            hosts |= {(address, name) for address in here}
        router = routers.get(network.project_id, "")
        result.append(
            DnsService(
                network_id=network.pk.hex,
                vni=network.vni,
                domain=zone(network.project.slug),
                addresses=tuple(
                    f"{s.gateway_ip}/{ipaddress.IPv4Network(s.cidr).prefixlen}" for s in subnets_of
                ),
                router_id=router,
                mac="" if router else dns_mac(network.pk.hex),
                hosts=tuple(sorted(hosts)),
                upstreams=settings.DNS_UPSTREAM,
            )
        )
    return tuple(result)
