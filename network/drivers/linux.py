"""Tenant overlays on a Linux host: a VXLAN device and a bridge per network, ports on the
bridge, static FDB entries for the remote VTEPs and MACs (learning off, no multicast).

``LinuxNetworkDriver.resync(desired)`` reads the host once (one link dump, one FDB dump),
then writes only what differs, in an order that never leaves a port on the wrong network:
bridges and VXLAN devices first, then ports, then FDB entries, then the removal of Kumo
devices nothing names any more. A device of the right name but the wrong kind or VNI is
replaced. Every netlink write goes through ``network.drivers.netlink``.
"""

from __future__ import annotations

import logging

from network.drivers.base import (
    KUMO_PREFIXES,
    PORT_PREFIX,
    VXLAN_PREFIX,
    HostNetworks,
    Network,
    NetworkDriverError,
    Port,
    ResyncResult,
    bridge_name,
    vxlan_name,
)
from network.drivers.netlink import Link, Netlink

log = logging.getLogger(__name__)


class LinuxNetworkDriver:
    """One host's tenant networking, in the namespace ``netns`` (the host's own if empty)."""

    def __init__(self, netns: str = "") -> None:
        self.nl = Netlink(netns)

    def close(self) -> None:
        self.nl.close()

    def resync(self, desired: HostNetworks) -> ResyncResult:
        """Converge the host to ``desired``; safe to repeat. A host already converged costs
        two netlink dumps and no write."""
        start = self.nl.writes
        result = ResyncResult()
        links = self.nl.links()
        underlay = 0
        if desired.underlay_device:
            if desired.underlay_device not in links:
                raise NetworkDriverError(f"underlay device {desired.underlay_device} is missing")
            underlay = links[desired.underlay_device].index

        for net in desired.networks:
            self._ensure_network(links, net, underlay, result)
        mtus = {net.vni: net.mtu for net in desired.networks}
        for port in desired.ports:
            self._ensure_port(links, port, mtus[port.vni], result)
            self._ensure_master(links, port.name, bridge_name(port.vni))
        self._sync_fdb(links, desired.networks)
        self._remove_stale(links, desired, result)
        result.writes = self.nl.writes - start
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
        changes = {}
        if link.mtu != mtu:
            changes["mtu"] = mtu
        if not link.up:
            changes["state"] = "up"
        if changes:
            self.nl.set_link(link.index, link.name, **changes)

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
        changes = {}
        if link.master != master.index:
            changes["master"] = master.index
        if link.mtu != master.mtu:
            changes["mtu"] = master.mtu
        if not link.up:
            changes["state"] = "up"
        if changes:
            self.nl.set_link(link.index, name, **changes)

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

    # -- what nothing names any more --------------------------------------------------------

    def _remove_stale(self, links, desired: HostNetworks, result) -> None:
        wanted = {p.name for p in desired.ports}
        for net in desired.networks:
            wanted |= {vxlan_name(net.vni), bridge_name(net.vni)}
        # Ports first, then VXLAN devices, then bridges: nothing is left on a missing bridge.
        order = {PORT_PREFIX: 0, VXLAN_PREFIX: 1}
        stale = sorted(
            (name for name in links if name.startswith(KUMO_PREFIXES) and name not in wanted),
            key=lambda name: order.get(name[:3], 2),
        )
        for name in stale:
            self.nl.delete_link(links[name].index, name)
            result.removed.append(name)


_NONE = Link(index=0, name="", kind="", master=0, up=False, mtu=0, mac="")
