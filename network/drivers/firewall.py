"""Security groups: per-port nftables filtering of bridged traffic on a host.

For every bridged port with ``firewall`` set (``Port.firewall is not None``) the host holds:

- anti-spoofing: frames from the port's ``tp-`` device carry its MAC, and IPv4 and ARP
  carry one of its ``ips`` as sender (ARP probes from 0.0.0.0 too); anything else from it,
  IPv6 included, is dropped;
- state: replies to flows that were let through (conntrack established or related) pass
  both ways;
- new flows leave the port only when an ``egress`` rule allows them and reach it only when
  an ``ingress`` rule does (protocol, destination port range, the other end's CIDR).

Ports with ``firewall`` None, router legs and VXLAN devices are not filtered; SR-IOV VF
ports bypass the bridge and cannot be filtered here. Rules with an IPv6 ``remote_cidr``
match nothing (the contract gives ports IPv4 addresses only).

Kernel note, found on this workplace's kernel (6.x, built without modules): the ``bridge``
family has no conntrack (``CONFIG_NF_CONNTRACK_BRIDGE`` is not set), so a ``ct`` expression
in a bridge table is refused ("Protocol error"). ``br_netfilter`` is built in, though, and
passes bridged IPv4 through the ``ip`` family's hooks, where conntrack works. So the state
lives in a small ``ip`` table (``kumo_conntrack``) and the port policy in the ``bridge``
table (``kumo_filter``), which knows the ports by name:

- in ``ip`` prerouting at priority raw, each bridge's traffic gets its own conntrack zone
  (projects' overlapping addresses never share a connection); at priority mangle, after
  conntrack, bit ``ESTABLISHED_MARK`` of the packet mark is set exactly when the packet
  belongs to an established or related connection;
- the ``bridge`` forward chain reads that bit for "replies pass".

This needs ``net.bridge.bridge-nf-call-iptables=1`` in the host's namespace, which the sync
sets. Zones are 16 bits and VNIs 24, so a VNI's zone is folded (``conntrack_zone``): two
networks of one host whose VNIs are 65535 apart would share a zone.

Both tables are written in one transaction, and only when their rendering changed; a host
without filtered ports has neither.
"""

from __future__ import annotations

import ipaddress

from network.drivers.base import BRIDGE_PREFIX, FirewallRule, HostNetworks, Port, bridge_name
from network.drivers.netlink import Netlink
from network.drivers.nft import Nftables, Table

FILTER_TABLE = ("bridge", "kumo_filter")
STATE_TABLE = ("ip", "kumo_conntrack")
ESTABLISHED_MARK = 0x01000000
_MARK_KEEP = 0xFFFFFFFF ^ ESTABLISHED_MARK
_ESTABLISHED = f"meta mark and {ESTABLISHED_MARK:#010x} == {ESTABLISHED_MARK:#010x}"


def conntrack_zone(vni: int) -> int:
    """The conntrack zone of a network's bridged traffic: 1..65535, the VNI itself up to
    65535."""
    return 1 + (vni - 1) % 65535


def sync_firewall(nl: Netlink, nft: Nftables, desired: HostNetworks) -> None:
    """Converge the host's security-group tables to ``desired``; no write when they are
    already as rendered."""
    tables = firewall_tables(desired)
    if not tables:
        nft.delete(*FILTER_TABLE)
        nft.delete(*STATE_TABLE)
        return
    nl.ensure_sysctl("net/bridge/bridge-nf-call-iptables", "1")
    nft.apply(*tables)


def firewall_tables(desired: HostNetworks) -> tuple[Table, Table] | tuple[()]:
    """The state table and the filter table for ``desired``; none without filtered ports."""
    ports = sorted(
        (p for p in desired.ports if p.firewall is not None and p.kind != "vf"),
        key=lambda p: p.name,
    )
    if not ports:
        return ()
    return _state_table(desired), _filter_table(ports)


def _state_table(desired: HostNetworks) -> Table:
    zones = ", ".join(
        f'"{bridge_name(n.vni)}" : {conntrack_zone(n.vni)}'
        for n in sorted(desired.networks, key=lambda n: n.vni)
    )
    bridged = f'iifname "{BRIDGE_PREFIX}*"'
    body = f"""
chain zone {{
  type filter hook prerouting priority raw; policy accept;
  {f"ct zone set iifname map {{ {zones} }}" if zones else ""}
}}
chain state {{
  type filter hook prerouting priority mangle; policy accept;
  {bridged} meta mark set meta mark and {_MARK_KEEP:#010x}
  {bridged} ct state established,related meta mark set meta mark or {ESTABLISHED_MARK:#010x}
}}"""
    return Table(*STATE_TABLE, body)


def _filter_table(ports: list[Port]) -> Table:
    dispatch_from = ", ".join(f'"{p.name}" : jump from-{p.name}' for p in ports)
    dispatch_to = ", ".join(f'"{p.name}" : jump to-{p.name}' for p in ports)
    chains = [
        f"""chain forward {{
  type filter hook forward priority filter; policy accept;
  iifname vmap {{ {dispatch_from} }}
  oifname vmap {{ {dispatch_to} }}
}}"""
    ]
    for port in ports:
        chains.append(_from_port_chain(port))
        chains.append(_to_port_chain(port))
    return Table(*FILTER_TABLE, "\n".join(chains))


def _from_port_chain(port: Port) -> str:
    """Anti-spoofing, then replies, then egress rules; what passes returns to ``forward``
    for the destination's own check."""
    ips = ", ".join(sorted(port.ips))
    arp_ips = ", ".join(["0.0.0.0", *sorted(port.ips)])
    lines = [
        f"ether saddr != {port.mac} drop",
        f"ether type arp arp saddr ether != {port.mac} drop",
        f"ether type arp arp saddr ip != {{ {arp_ips} }} drop",
        "ether type arp return",
        "ether type != ip drop",
        f"ip saddr != {{ {ips} }} drop" if ips else "drop",
        f"{_ESTABLISHED} return",
        *(f"{_match(r, 'daddr')} return".lstrip() for r in _rules(port, "egress")),
        "drop",
    ]
    return _chain(f"from-{port.name}", lines)


def _to_port_chain(port: Port) -> str:
    lines = [
        "ether type arp accept",
        "ether type != ip drop",
        f"{_ESTABLISHED} accept",
        *(f"{_match(r, 'saddr')} accept".lstrip() for r in _rules(port, "ingress")),
        "drop",
    ]
    return _chain(f"to-{port.name}", lines)


def _chain(name: str, lines: list[str]) -> str:
    return "chain " + name + " {\n" + "".join(f"  {line}\n" for line in lines) + "}"


def _rules(port: Port, direction: str) -> list[FirewallRule]:
    """The port's IPv4 rules of one direction, once each, in a stable order."""
    return sorted(
        {
            r
            for r in port.firewall or ()
            if r.direction == direction and ipaddress.ip_network(r.remote_cidr).version == 4
        },
        key=repr,
    )


def _match(rule: FirewallRule, remote: str) -> str:
    """The rule as an nft match ("" for a rule that allows everything); ``remote`` is the
    field the other end is in."""
    parts = []
    if ipaddress.ip_network(rule.remote_cidr).prefixlen:
        parts.append(f"ip {remote} {rule.remote_cidr}")
    if rule.port_min:
        ports = str(rule.port_min)
        if rule.port_max != rule.port_min:
            ports += f"-{rule.port_max}"
        parts.append(f"{rule.protocol} dport {ports}")
    elif rule.protocol != "any":
        parts.append(f"meta l4proto {rule.protocol}")
    return " ".join(parts)
