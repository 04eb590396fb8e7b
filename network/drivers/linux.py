"""Tenant overlays on a Linux host: a VXLAN device and a bridge per network, ports on the
bridge, static FDB entries for the remote VTEPs and MACs (learning off, no multicast); an
L2VPN's VLAN device on the trunk joins its network's bridge; an SR-IOV VF port joins no
bridge: its MAC, VLAN and trust are set on its physical function.

``LinuxNetworkDriver.resync(desired)`` reads the host once (one link dump, one FDB dump),
then writes only what differs, in an order that never leaves a port on the wrong network:
bridges, VXLAN and VLAN devices first, then ports, then FDB entries, then the ports'
security groups (``firewall``), the projects' routers (``routers``) and the networks'
resolvers (``dns``; stale ones go before the routers converge), then the removal of
Kumo devices nothing names any more. A device of the right name but the wrong kind, VNI or
VLAN id is replaced. A VF port on a missing physical function, or past its VFs, fails the
resync before any write. Every netlink write goes through ``network.drivers.netlink``.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from network.drivers.base import (
    KUMO_PREFIXES,
    PORT_PREFIX,
    VLAN_PREFIX,
    VXLAN_PREFIX,
    HostNetworks,
    Network,
    NetworkDriver,
    NetworkDriverError,
    Port,
    ResyncResult,
    bridge_name,
    vxlan_name,
)
from network.drivers.dns import DnsServices, dns_devices
from network.drivers.firewall import sync_firewall
from network.drivers.netlink import Link, Netlink, Vf
from network.drivers.nft import Nftables
from network.drivers.routers import Routers, router_devices

log = logging.getLogger(__name__)


class LinuxNetworkDriver(NetworkDriver):
    """One host's tenant networking, in the namespace ``netns`` (the host's own if empty).
    ``dns_dir`` holds the networks' resolvers' files (default: a folder per namespace
    under the temporary directory; the agent gives its own)."""

    def __init__(self, netns: str = "", *, dns_dir: Path | str | None = None) -> None:
        self.nl = Netlink(netns)
        self.nft = Nftables(netns)
        self.routers = Routers(self.nl)
        if dns_dir is None:
            dns_dir = Path(tempfile.gettempdir()) / "kumo-dns" / (netns or "host")
        self.dns = DnsServices(self.nl, Path(dns_dir))

    def close(self) -> None:
        self.dns.close()
        self.routers.close()
        self.nft.close()
        self.nl.close()

    def capabilities(self) -> dict:
        """What the host offers beyond overlays, for the agent to report: its SR-IOV
        physical functions and how many VFs each has (``{"sriov_pfs": {"enp1s0f0": 8}}``;
        empty without SR-IOV hardware)."""
        return {"sriov_pfs": self.nl.sriov_pfs()}

    def resync(self, desired: HostNetworks) -> ResyncResult:
        """Converge the host to ``desired``; safe to repeat. A host already converged costs
        two netlink dumps and no write."""
        start = self.nl.writes
        result = ResyncResult()
        links = self.nl.links()
        underlay = _index_of(links, desired.underlay_device, "underlay")
        trunk = _index_of(links, desired.trunk_device, "trunk")
        _check_vfs(links, desired.ports)

        for net in desired.networks:
            self._ensure_network(links, net, underlay, result)
            if net.l2vpn_vlan:
                self._ensure_vlan(links, net, trunk, result)
        mtus = {net.vni: net.mtu for net in desired.networks}
        for port in desired.ports:
            if port.kind == "vf":
                self._ensure_vf(links, port)
                continue
            self._ensure_port(links, port, mtus[port.vni], result)
            self._ensure_master(links, port.name, bridge_name(port.vni))
        self._sync_fdb(links, desired.networks)
        self._sync_firewall(desired, result)
        dns_writes = self.dns.writes
        self.dns.remove_stale(desired, result)
        self._sync_routers(links, desired, result)
        self.dns.sync(links, desired, result)
        result.writes += self.dns.writes - dns_writes
        self._remove_stale(links, desired, result)
        result.writes += self.nl.writes - start
        if result.writes:
            log.info(
                "resync: %d writes, created %s, removed %s",
                result.writes,
                result.created,
                result.removed,
            )
        return result

    # -- networks and ports -----------------------------------------------------------------

    def _replace_if(self, links: dict[str, Link], name: str, wrong: bool, result) -> bool:
        """Delete ``name`` when it exists but is ``wrong``; True when it must be made."""
        link = links.get(name)
        if link is not None and wrong:
            log.warning("%s is a %s, not what Kumo wants: replaced", name, link.kind or "device")
            self.nl.delete_link(link.index, name)
            result.removed.append(name)
            del links[name]
        return name not in links

    def _ensure_up(self, link: Link, mtu: int) -> None:
        if link.mtu != mtu or not link.up:
            self.nl.set_link(
                link.index, link.name, mtu=mtu if link.mtu != mtu else None, up=not link.up
            )

    def _ensure_network(self, links, net: Network, underlay: int, result) -> None:
        """The bridge and the VXLAN device on it, both up at the network's MTU. New ones are
        made in that state (two writes); existing ones get only what differs."""
        bridge, vxlan = bridge_name(net.vni), vxlan_name(net.vni)
        if self._replace_if(links, bridge, links.get(bridge, _NONE).kind != "bridge", result):
            index = self.nl.add_bridge(bridge, net.mtu)
            links[bridge] = Link(
                index=index, name=bridge, kind="bridge", master=0, up=True, mtu=net.mtu, mac=""
            )
            result.created.append(bridge)
        else:
            self._ensure_up(links[bridge], net.mtu)
            # What the bridge is now: its ports (the VXLAN device, the VMs') follow its MTU.
            links[bridge] = replace(links[bridge], mtu=net.mtu, up=True)
        current = links.get(vxlan, _NONE)
        wrong = (current.kind, current.vni) != ("vxlan", net.vni)
        if self._replace_if(links, vxlan, wrong, result):
            index = self.nl.add_vxlan(
                vxlan,
                vni=net.vni,
                local=net.local_vtep,
                mtu=net.mtu,
                master=links[bridge].index,
                underlay=underlay,
            )
            links[vxlan] = Link(
                index=index,
                name=vxlan,
                kind="vxlan",
                master=links[bridge].index,
                up=True,
                mtu=net.mtu,
                mac="",
                vni=net.vni,
            )
            result.created.append(vxlan)
        else:
            self._ensure_master(links, vxlan, bridge)

    def _ensure_vlan(self, links, net: Network, trunk: int, result) -> None:
        """The network's L2VPN: VLAN device ``vl-<vni>`` of its VLAN id on the trunk, up on
        its bridge at its MTU, made so in one write. One of another VLAN id or on another
        device is replaced."""
        name, bridge = vlan_name(net.vni), links[bridge_name(net.vni)]
        current = links.get(name, _NONE)
        wrong = (current.kind, current.vlan, current.lower) != ("vlan", net.l2vpn_vlan, trunk)
        if not self._replace_if(links, name, wrong, result):
            self._ensure_master(links, name, bridge.name)
            return
        index = self.nl.add_vlan(
            name, vlan=net.l2vpn_vlan, trunk=trunk, mtu=net.mtu, master=bridge.index
        )
        links[name] = Link(
            index=index,
            name=name,
            kind="vlan",
            master=bridge.index,
            up=True,
            mtu=net.mtu,
            mac="",
            vlan=net.l2vpn_vlan,
            lower=trunk,
        )
        result.created.append(name)

    def _ensure_vf(self, links, port: Port) -> None:
        """The port's VF set on its physical function: its MAC, its VLAN and trust on; one
        write, and none when the VF already is so (``_check_vfs`` vouched for the VF)."""
        pf = links[port.pf]
        if Vf(index=port.vf_index, mac=port.mac, vlan=port.vlan, trusted=True) not in pf.vfs:
            self.nl.set_vf(pf, port.vf_index, mac=port.mac, vlan=port.vlan)

    def _ensure_port(self, links, port: Port, mtu: int, result) -> None:
        """The port's device; a new one is left down and off the bridge for
        ``_ensure_master`` to attach in one write."""
        kind = "tun" if port.kind == "tap" else "veth"
        if not self._replace_if(links, port.name, links.get(port.name, _NONE).kind != kind, result):
            return
        if port.kind == "tap":
            index = self.nl.add_tap(port.name)
        else:
            index = self.nl.add_veth(
                port.name,
                peer=port.peer_name,
                peer_netns=port.peer_netns,
                peer_mac=port.mac,
                mtu=mtu,
            )
        links[port.name] = Link(
            index=index, name=port.name, kind=kind, master=0, up=False, mtu=0, mac=""
        )
        result.created.append(port.name)

    def _ensure_master(self, links, name: str, bridge: str) -> None:
        link, master = links[name], links[bridge]
        if (link.master, link.mtu, link.up) != (master.index, master.mtu, True):
            self.nl.set_link(
                link.index,
                name,
                master=master.index if link.master != master.index else None,
                mtu=master.mtu if link.mtu != master.mtu else None,
                up=not link.up,
            )

    # -- forwarding entries -----------------------------------------------------------------

    def _sync_fdb(self, links, networks) -> None:
        current = self.nl.vxlan_fdb()
        for net in networks:
            index = links[vxlan_name(net.vni)].index
            have = current.get(index, set())
            for mac, dst in sorted(net.fdb - have):
                self.nl.fdb_add(index, mac, dst)
            for mac, dst in sorted(have - net.fdb):
                self.nl.fdb_delete(index, mac, dst)

    # -- security groups and routers (nftables, router namespaces) ---------------------------

    def _sync_firewall(self, desired: HostNetworks, result) -> None:
        """The ports' security groups (``network.drivers.firewall``); nft writes counted."""
        before = self.nft.writes
        sync_firewall(self.nl, self.nft, desired)
        result.writes += self.nft.writes - before

    def _sync_routers(self, links, desired: HostNetworks, result) -> None:
        """The projects' routers (``network.drivers.routers``); the writes inside their
        namespaces counted."""
        result.writes += self.routers.sync(links, desired, result)

    # -- what nothing names any more --------------------------------------------------------

    def _remove_stale(self, links, desired: HostNetworks, result) -> None:
        wanted = {p.name for p in desired.ports if p.kind != "vf"} | router_devices(desired)
        wanted |= dns_devices(desired)
        for net in desired.networks:
            wanted |= {vxlan_name(net.vni), bridge_name(net.vni)}
            if net.l2vpn_vlan:
                wanted.add(vlan_name(net.vni))
        # Ports first, then VXLAN and VLAN devices, then bridges: nothing is left on a
        # missing bridge.
        order = {PORT_PREFIX: 0, VXLAN_PREFIX: 1, VLAN_PREFIX: 1}
        stale = sorted(
            (name for name in links if name.startswith(KUMO_PREFIXES) and name not in wanted),
            key=lambda name: order.get(name[:3], 2),
        )
        for name in stale:
            link = links[name]
            if link.kind == "tun" and link.carrier:
                # Held by an open file: a guest's QEMU. Deleting it would cut that guest
                # off for good (a tap made again is not the one QEMU holds). The state
                # being applied is older than the guest (a VM placed here again while
                # this host still applies its leaving); the next state names the tap,
                # and a tap nobody holds any more goes at the next resync.
                log.warning("tap %s is held (a guest runs on it): left in place", name)
                continue
            self.nl.delete_link(link.index, name)
            result.removed.append(name)


_NONE = Link(index=0, name="", kind="", master=0, up=False, mtu=0, mac="")


def vlan_name(vni: int) -> str:
    return f"{VLAN_PREFIX}{vni}"


def _index_of(links: dict[str, Link], name: str, role: str) -> int:
    """The index of existing device ``name`` (0 when no device is named)."""
    if not name:
        return 0
    if name not in links:
        raise NetworkDriverError(f"{role} device {name} is missing")
    return links[name].index


def _check_vfs(links: dict[str, Link], ports) -> None:
    """Refuse, before any write, a VF port whose physical function is missing or has no such
    VF: the agent never pretends to have attached one."""
    for port in ports:
        if port.kind != "vf":
            continue
        pf = links.get(port.pf)
        if pf is None:
            raise NetworkDriverError(
                f"port {port.port_id}: physical function {port.pf} is missing on this host"
            )
        if port.vf_index >= pf.num_vfs:
            raise NetworkDriverError(
                f"port {port.port_id}: {port.pf} has {pf.num_vfs} VFs, "
                f"so no VF {port.vf_index} (not an SR-IOV physical function, or too few VFs)"
            )
