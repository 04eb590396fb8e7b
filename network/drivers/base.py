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
- ``tp-<port id>``: a port's host-side device (first 12 characters of the port id).

Devices with those prefixes are Kumo's: a resync removes the ones no desired object names.
Every other device on the host is left alone.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

VXLAN_PORT = 4789  # IANA's VXLAN port
VXLAN_OVERHEAD = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
MAX_VNI = 2**24 - 1
IFNAMSIZ = 15
VXLAN_PREFIX, BRIDGE_PREFIX, PORT_PREFIX = "vx-", "br-", "tp-"
KUMO_PREFIXES = (VXLAN_PREFIX, BRIDGE_PREFIX, PORT_PREFIX)
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

    def __post_init__(self) -> None:
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
class Port:
    """One port attached to a network's bridge.

    ``kind`` is ``tap`` (a persistent tap device a VM's ``<interface type='ethernet'>``
    opens) or ``veth`` (a pair whose peer, named ``peer_name`` and given ``mac``, lives in
    network namespace ``peer_netns``: containers, and the tests' stand-in VMs).
    """

    port_id: str
    vni: int
    mac: str
    kind: str = "tap"
    peer_netns: str = ""
    peer_name: str = "eth0"

    def __post_init__(self) -> None:
        port_name(self.port_id)
        if self.kind not in ("tap", "veth"):
            raise ValueError(f"port kind {self.kind!r}: want tap or veth")
        if self.kind == "veth" and not self.peer_netns:
            raise ValueError("a veth port needs the namespace of its peer")
        if not _MAC_RE.match(self.mac):
            raise ValueError(f"invalid MAC {self.mac!r}: want lower-case aa:bb:cc:dd:ee:ff")

    @property
    def name(self) -> str:
        return port_name(self.port_id)


@dataclass(frozen=True)
class HostNetworks:
    """Everything Kumo wants of one host's tenant networking."""

    networks: tuple[Network, ...] = ()
    ports: tuple[Port, ...] = ()
    underlay_device: str = ""  # the VXLAN devices' underlay link (empty: routed by address)

    def __post_init__(self) -> None:
        vnis = [n.vni for n in self.networks]
        if len(set(vnis)) != len(vnis):
            raise ValueError("a VNI is listed twice")
        names = [p.name for p in self.ports]
        if len(set(names)) != len(names):
            raise ValueError("two ports map to one device name")
        missing = {p.vni for p in self.ports} - set(vnis)
        if missing:
            raise ValueError(f"ports on networks not on this host: VNI {sorted(missing)}")


@dataclass
class ResyncResult:
    """What one resync did: netlink writes made, and devices it created and removed."""

    writes: int = 0
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
