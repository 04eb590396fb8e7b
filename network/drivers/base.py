"""The host network driver contract: what one host's tenant networks should look like.

Django-free (the host agent runs it). The desired state of a host is one ``HostNetworks``
value: the overlay networks present on the host and the ports attached to them. A driver
converges the host to it with ``resync``, which reads the host once, writes only the
difference, and returns how many netlink writes it made: a resync with nothing to change
writes nothing, so it is safe to run at start, after any error, and periodically.

Device names derive from ids and stay within the kernel's 15 characters (``IFNAMSIZ`` - 1),
so the same network always has the same devices on every host and the agent can find what
it made after a restart without remembering anything:

- ``vx-<vni>``: the VXLAN device of VNI ``vni`` (decimal, at most 8 digits);
- ``br-<vni>``: its bridge;
- ``tp-<port id>``: a port's host-side device (first 12 characters of the port id);
- ``vl-<vni>``: the VLAN device on the trunk that carries a network's L2VPN (gateway host);
- ``ri-<vni>``: the host side of a router's leg on a network's bridge (gateway host);
- ``re-<router id>``: the host side of a router's leg on the external bridge (gateway host);
- ``kumo-r-<router id>``: a router's network namespace (first 12 characters of the id);
  inside it, ``qr-<vni>`` faces each network and ``qg-0`` the external network;
- ``di-<vni>``: the host side of a network's own DNS namespace's leg (gateway host);
- ``kumo-d-<network id>``: the DNS namespace of a network whose project has no router
  (first 12 characters of the id); inside it, ``qd-<vni>`` holds the subnets' gateways.

Every project network with a gateway has a resolver (``DnsService``): dnsmasq answering at
the subnets' gateway addresses, in the project's router namespace when it has one, else in
the network's own DNS namespace (``network.drivers.dns``).

Devices and namespaces with those prefixes are Kumo's: a resync removes the ones no desired
object names. Every other device on the host is left alone.

Security groups become nftables rules per port (``Port.firewall``) in one table of the
host's ``bridge`` family; NAT (SNAT, 1:1 NAT of global IPs, DNAT port forwards) lives in one
``ip`` table inside each router's namespace, so projects with overlapping CIDRs never meet.
"""

from __future__ import annotations

import abc
import ipaddress
import re
from dataclasses import dataclass, field

VXLAN_PORT = 4789  # IANA's VXLAN port
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
MAX_VNI = 2**24 - 1
IFNAMSIZ = 15
VXLAN_PREFIX, BRIDGE_PREFIX, PORT_PREFIX = "vx-", "br-", "tp-"
VLAN_PREFIX, ROUTER_LEG_PREFIX, ROUTER_EXT_PREFIX = "vl-", "ri-", "re-"
DNS_LEG_PREFIX = "di-"
KUMO_PREFIXES = (
    DNS_LEG_PREFIX,
    VXLAN_PREFIX,
    BRIDGE_PREFIX,
    PORT_PREFIX,
    VLAN_PREFIX,
    ROUTER_LEG_PREFIX,
    ROUTER_EXT_PREFIX,
)
ROUTER_NETNS_PREFIX = "kumo-r-"
DNS_NETNS_PREFIX = "kumo-d-"
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
PROTOCOLS = ("any", "tcp", "udp", "icmp")
_PORT_ID_RE = re.compile(r"^[A-Za-z0-9]{1,64}$")
_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


class NetworkDriverError(Exception):
    """The kernel refused an operation. ``errno`` is its error number when it gave one."""

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def overlay_mtu(underlay_mtu: int) -> int:
    """The MTU tenant traffic gets over an underlay of ``underlay_mtu``: 1450 on 1500."""
    return underlay_mtu - VXLAN_OVERHEAD


def vxlan_name(vni: int) -> str:
    return f"{VXLAN_PREFIX}{vni}"


def bridge_name(vni: int) -> str:
    return f"{BRIDGE_PREFIX}{vni}"


def port_name(port_id: str) -> str:
    """``tp-`` and the first 12 characters of the port id (ids are UUIDs in hex: 48 bits,
    and ``HostNetworks`` refuses two ports of one host that map to one name)."""
    if not _PORT_ID_RE.match(port_id):
        raise ValueError(f"invalid port id {port_id!r}: want 1-64 letters and digits")
    return (PORT_PREFIX + port_id)[:IFNAMSIZ]


def router_netns(router_id: str) -> str:
    """``kumo-r-`` and the first 12 characters of the router id."""
    if not _PORT_ID_RE.match(router_id):
        raise ValueError(f"invalid router id {router_id!r}: want 1-64 letters and digits")
    return ROUTER_NETNS_PREFIX + router_id[:12]


def dns_netns(network_id: str) -> str:
    """``kumo-d-`` and the first 12 characters of the network id."""
    if not _PORT_ID_RE.match(network_id):
        raise ValueError(f"invalid network id {network_id!r}: want 1-64 letters and digits")
    return DNS_NETNS_PREFIX + network_id[:12]


@dataclass(frozen=True)
class Network:
    """One overlay network as it should be on this host.

    ``remote_vteps``: the underlay addresses of the other hosts with ports on this network;
    broadcast and unknown unicast go to each of them (head-end replication: no multicast in
    the underlay). ``remote_macs`` maps a MAC on another host to that host's VTEP, written
    as a static FDB entry, so known unicast goes straight to its host; learning is off.
    """

    vni: int
    mtu: int
    local_vtep: str
    remote_vteps: tuple[str, ...] = ()
    remote_macs: tuple[tuple[str, str], ...] = ()
    #: an L2VPN: this VLAN id on ``HostNetworks.trunk_device`` joins the bridge (0: none)
    l2vpn_vlan: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.l2vpn_vlan <= 4094:
            raise ValueError(f"VLAN {self.l2vpn_vlan} out of range 1..4094")
        if not 1 <= self.vni <= MAX_VNI:
            raise ValueError(f"VNI {self.vni} out of range 1..{MAX_VNI}")
        if not 68 <= self.mtu <= 65535 - VXLAN_OVERHEAD:
            raise ValueError(f"MTU {self.mtu} out of range")
        for address in (self.local_vtep, *self.remote_vteps, *(v for _, v in self.remote_macs)):
            ipaddress.IPv4Address(address)
        for mac, _ in self.remote_macs:
            if not _MAC_RE.match(mac):
                raise ValueError(f"invalid MAC {mac!r}: want lower-case aa:bb:cc:dd:ee:ff")

    @property
    def fdb(self) -> frozenset[tuple[str, str]]:
        """Every static FDB entry of the VXLAN device: (MAC, remote VTEP)."""
        flood = {("00:00:00:00:00:00", vtep) for vtep in self.remote_vteps}
        return frozenset(flood | set(self.remote_macs))


@dataclass(frozen=True)
class FirewallRule:
    """One allowed flow of a port (security groups are allow-lists).

    ``ingress`` rules match traffic to the port, ``egress`` traffic from it; ``remote_cidr``
    is the other end (a remote security group arrives here already resolved to the
    addresses of its ports). ``port_min``/``port_max`` bound the destination port of tcp
    and udp (0: any port).
    """

    direction: str
    protocol: str = "any"
    port_min: int = 0
    port_max: int = 0
    remote_cidr: str = "0.0.0.0/0"

    def __post_init__(self) -> None:
        if self.direction not in ("ingress", "egress"):
            raise ValueError(f"direction {self.direction!r}: want ingress or egress")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol {self.protocol!r}: want one of {PROTOCOLS}")
        if self.port_min or self.port_max:
            if self.protocol not in ("tcp", "udp"):
                raise ValueError("ports apply to tcp and udp only")
            if not 1 <= self.port_min <= self.port_max <= 65535:
                raise ValueError(f"port range {self.port_min}-{self.port_max} is invalid")
        ipaddress.ip_network(self.remote_cidr)


@dataclass(frozen=True)
class Port:
    """One port attached to a network's bridge.

    ``kind`` is ``tap`` (a persistent tap device a VM's ``<interface type='ethernet'>``
    opens), ``veth`` (a pair whose peer, named ``peer_name`` and given ``mac``, lives in
    network namespace ``peer_netns``: containers, and the tests' stand-in VMs) or ``vf``
    (an SR-IOV virtual function ``vf_index`` of the physical function netdev ``pf``, passed
    through to the VM: the agent sets its MAC, VLAN ``vlan`` and trust; it joins no bridge,
    the NIC's switch carries it).

    ``ips`` are the port's fixed addresses. ``firewall`` is None when the port is not
    filtered; otherwise traffic from the port must come from ``mac`` and one of ``ips``,
    replies to allowed flows pass, and new flows pass only when a rule allows them.
    """

    port_id: str
    vni: int
    mac: str
    kind: str = "tap"
    peer_netns: str = ""
    peer_name: str = "eth0"
    ips: tuple[str, ...] = ()
    firewall: tuple[FirewallRule, ...] | None = None
    pf: str = ""
    vf_index: int = -1
    vlan: int = 0

    def __post_init__(self) -> None:
        port_name(self.port_id)
        if self.kind not in ("tap", "veth", "vf"):
            raise ValueError(f"port kind {self.kind!r}: want tap, veth or vf")
        if self.kind == "vf" and (not self.pf or self.vf_index < 0):
            raise ValueError("a vf port needs its physical function and VF index")
        for address in self.ips:
            ipaddress.IPv4Address(address)
        if self.kind == "veth" and not self.peer_netns:
            raise ValueError("a veth port needs the namespace of its peer")
        if not _MAC_RE.match(self.mac):
            raise ValueError(f"invalid MAC {self.mac!r}: want lower-case aa:bb:cc:dd:ee:ff")

    @property
    def name(self) -> str:
        return port_name(self.port_id)


@dataclass(frozen=True)
class RouterInterface:
    """A router's leg on a network: ``address`` (the subnet's gateway, with its prefix
    length, e.g. ``192.168.10.1/24``) with ``mac``, on the bridge of VNI ``vni``."""

    vni: int
    address: str
    mac: str

    def __post_init__(self) -> None:
        ipaddress.IPv4Interface(self.address)
        if not _MAC_RE.match(self.mac):
            raise ValueError(f"invalid MAC {self.mac!r}: want lower-case aa:bb:cc:dd:ee:ff")


@dataclass(frozen=True)
class PortForward:
    """DNAT: ``protocol`` traffic to ``global_ip:external_port`` goes to
    ``internal_ip:internal_port``."""

    global_ip: str
    protocol: str
    external_port: int
    internal_ip: str
    internal_port: int

    def __post_init__(self) -> None:
        if self.protocol not in ("tcp", "udp"):
            raise ValueError(f"protocol {self.protocol!r}: want tcp or udp")
        ipaddress.IPv4Address(self.global_ip)
        ipaddress.IPv4Address(self.internal_ip)
        for port in (self.external_port, self.internal_port):
            if not 1 <= port <= 65535:
                raise ValueError(f"port {port} out of range")


@dataclass(frozen=True)
class Router:
    """One project's router on the gateway host, in its own network namespace.

    ``interfaces``: its legs on the project's networks. ``external_address`` (with prefix
    length) is its own address on the external network, on a leg to
    ``HostNetworks.external_bridge``; ``external_gateway`` the default route's next hop.
    Traffic from ``snat_cidrs`` leaving to the external network is source-NATed to
    ``external_address``; ``floating`` maps a global IP 1:1 to an internal address (both
    directions); ``forwards`` are DNAT port forwards; ``routes`` (destination CIDR, next
    hop) are the project's own L3 routes to outside networks.
    """

    router_id: str
    interfaces: tuple[RouterInterface, ...] = ()
    external_address: str = ""
    external_gateway: str = ""
    snat_cidrs: tuple[str, ...] = ()
    floating: tuple[tuple[str, str], ...] = ()
    forwards: tuple[PortForward, ...] = ()
    routes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        router_netns(self.router_id)
        if self.external_address:
            ipaddress.IPv4Interface(self.external_address)
        for global_ip, internal in self.floating:
            ipaddress.IPv4Address(global_ip)
            ipaddress.IPv4Address(internal)

    @property
    def netns(self) -> str:
        return router_netns(self.router_id)


@dataclass(frozen=True)
class DnsService:
    """The resolver of one project network: dnsmasq listening on ``addresses`` (the
    subnets' gateways, with prefix length), answering ``hosts`` ((address, name): the
    project's VMs, each name as ``<name>.<domain>`` and bare) with authority for
    ``domain`` and every other name under its parent (another project's zone answers
    NXDOMAIN), and forwarding everything else to ``upstreams`` (empty: the nameservers of
    the host's own ``/etc/resolv.conf``).

    With ``router_id`` it runs in that router's namespace, whose legs already hold the
    addresses; otherwise in the network's own namespace (``dns_netns``), on a leg with
    ``mac`` on the network's bridge, which reaches nothing outside the network.
    """

    network_id: str
    vni: int
    domain: str
    addresses: tuple[str, ...]
    router_id: str = ""
    mac: str = ""
    hosts: tuple[tuple[str, str], ...] = ()
    upstreams: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        dns_netns(self.network_id)
        if self.router_id:
            router_netns(self.router_id)
        elif not _MAC_RE.match(self.mac):
            raise ValueError(f"invalid MAC {self.mac!r}: want lower-case aa:bb:cc:dd:ee:ff")
        if not self.addresses:
            raise ValueError("a DNS service needs an address to answer on")
        for address in self.addresses:
            ipaddress.IPv4Interface(address)
        for label in self.domain.split("."):
            if not _NAME_RE.match(label):
                raise ValueError(f"invalid domain {self.domain!r}")
        for address, name in self.hosts:
            ipaddress.IPv4Address(address)
            if not _NAME_RE.match(name):
                raise ValueError(f"invalid host name {name!r}")
        for server in self.upstreams:
            ipaddress.IPv4Address(server)

    @property
    def netns(self) -> str:
        return router_netns(self.router_id) if self.router_id else dns_netns(self.network_id)


@dataclass(frozen=True)
class HostNetworks:
    """Everything Kumo wants of one host's tenant networking.

    ``external_bridge`` (gateway host only) is the existing bridge onto the external
    network, where routers' external legs attach; ``trunk_device`` the existing device that
    carries L2VPN VLANs to outside networks.
    """

    networks: tuple[Network, ...] = ()
    ports: tuple[Port, ...] = ()
    underlay_device: str = ""  # the VXLAN devices' underlay link (empty: routed by address)
    routers: tuple[Router, ...] = ()
    external_bridge: str = ""
    trunk_device: str = ""
    dns: tuple[DnsService, ...] = ()

    def __post_init__(self) -> None:
        vnis = [n.vni for n in self.networks]
        if len(set(vnis)) != len(vnis):
            raise ValueError("a VNI is listed twice")
        names = [p.name for p in self.ports]
        if len(set(names)) != len(names):
            raise ValueError("two ports map to one device name")
        legs = {i.vni for r in self.routers for i in r.interfaces} | {d.vni for d in self.dns}
        missing = ({p.vni for p in self.ports if p.kind != "vf"} | legs) - set(vnis)
        if missing:
            raise ValueError(f"ports on networks not on this host: VNI {sorted(missing)}")
        if not self.external_bridge and any(r.external_address for r in self.routers):
            raise ValueError("routers with an external side need the external bridge")
        if any(n.l2vpn_vlan for n in self.networks) and not self.trunk_device:
            raise ValueError("an L2VPN VLAN needs the trunk device")
        routers = {r.router_id for r in self.routers}
        for service in self.dns:
            if service.router_id and service.router_id not in routers:
                raise ValueError(f"DNS of VNI {service.vni} is in a router not on this host")


@dataclass
class ResyncResult:
    """What one resync did: netlink writes made, and devices it created and removed."""

    writes: int = 0
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


class NetworkDriver(abc.ABC):
    """One host's tenant networking, as the agent drives it (``network.host_tasks``).

    The contract (``tests/network/test_driver_contract.py`` runs it against every driver):

    - ``resync(desired)`` converges the host to ``desired`` and is safe to repeat: a host
      already converged costs no write (``ResyncResult.writes == 0``), and a change of a
      device's settings (an MTU, an FDB entry, a firewall rule) changes it in place;
    - ``ResyncResult.created`` and ``removed`` name Kumo's devices and namespaces as
      ``vxlan_name``, ``bridge_name``, ``port_name``, ``router_netns`` and ``dns_netns``
      make them; an empty ``HostNetworks`` removes everything Kumo made and nothing else;
    - a device ``desired`` relies on that Kumo does not make (the underlay, the trunk, a
      VF's physical function) and that is missing is refused with ``NetworkDriverError``
      before any write;
    - ``capabilities()`` says what the host offers beyond overlays
      (``{"sriov_pfs": {pf: VF count}}``); ``close()`` lets go of what the driver holds.
    """

    @abc.abstractmethod
    def resync(self, desired: HostNetworks) -> ResyncResult: ...

    @abc.abstractmethod
    def capabilities(self) -> dict: ...

    @abc.abstractmethod
    def close(self) -> None: ...
