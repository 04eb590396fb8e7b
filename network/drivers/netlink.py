"""The one module that talks netlink for the host network driver.

Reads come back as small dataclasses in one dump each (every link; every VXLAN FDB entry);
every write goes through one method here, which counts it (``writes``: what a no-change
resync must keep at zero) and turns the kernel's errno into ``NetworkDriverError``.
``Netlink(netns=…)`` works inside a network namespace, as the tests' hosts are.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from network.drivers.base import VXLAN_PORT, NetworkDriverError

AF_BRIDGE = getattr(socket, "AF_BRIDGE", 7)


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str  # vxlan, bridge, veth, tun, ... ("" for a plain device)
    master: int  # the bridge's index, 0 when not enslaved
    up: bool
    mtu: int
    mac: str
    vni: int | None = None


class Netlink:
    """A netlink socket on one namespace (the host's own when ``netns`` is empty)."""

    def __init__(self, netns: str = "") -> None:
        self.netns = netns
        self.writes = 0
        self._ipr = IPRoute(netns=netns) if netns else IPRoute()
        self._next_index = 0  # the index the next device is asked to take (see _add)

    def close(self) -> None:
        self._ipr.close()

    # -- reads ------------------------------------------------------------------------------

    def links(self) -> dict[str, Link]:
        found = {}
        for msg in self._ipr.get_links():
            name = msg.get("IFLA_IFNAME")
            kind = msg.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) or ""
            vni = msg.get(("IFLA_LINKINFO", "IFLA_INFO_DATA", "IFLA_VXLAN_ID"))
            found[name] = Link(
                index=msg["index"],
                name=name,
                kind=kind,
                master=msg.get("IFLA_MASTER") or 0,
                up=bool(msg["flags"] & 1),  # IFF_UP
                mtu=msg.get("IFLA_MTU") or 0,
                mac=msg.get("IFLA_ADDRESS") or "",
                vni=vni if kind == "vxlan" else None,
            )
        self._next_index = max((link.index for link in found.values()), default=0) + 1
        return found

    def vxlan_fdb(self) -> dict[int, set[tuple[str, str]]]:
        """Static remote entries (MAC, VTEP) of every VXLAN device, by device index."""
        entries: dict[int, set[tuple[str, str]]] = {}
        for msg in self._ipr.fdb("dump"):
            dst = msg.get("NDA_DST")
            if dst:
                entries.setdefault(msg["ifindex"], set()).add((msg.get("NDA_LLADDR"), dst))
        return entries

    # -- writes -----------------------------------------------------------------------------

    def _write(self, what: str, fn, *args, **kwargs):
        self.writes += 1
        try:
            return fn(*args, **kwargs)
        except NetlinkError as e:
            raise NetworkDriverError(f"{what}: {e}", errno=e.code) from e

    def index(self, name: str) -> int:
        """The index of a device just made (one read)."""
        return self._ipr.link_lookup(ifname=name)[0]

    def _add(self, what: str, **attrs) -> int:
        """Make a device and return its index. The index is chosen here, past every index
        the last dump saw, so no read is needed to learn it; should something else have
        taken it meanwhile (EEXIST), the kernel picks one and it is looked up."""
        if self._next_index:
            index, self._next_index = self._next_index, self._next_index + 1
            try:
                self._write(what, self._ipr.link, "add", index=index, **attrs)
                return index
            except NetworkDriverError as e:
                if e.errno != 17 or self._ipr.link_lookup(ifname=attrs["ifname"]):
                    raise  # not the index's fault: the name is taken, or another error
        self._write(what, self._ipr.link, "add", **attrs)
        return self.index(attrs["ifname"])

    def add_bridge(self, name: str, mtu: int) -> int:
        """A bridge, up; returns its index."""
        return self._add(f"add bridge {name}", ifname=name, kind="bridge", mtu=mtu, state="up")

    def add_vxlan(
        self, name: str, *, vni: int, local: str, mtu: int, master: int, underlay: int = 0
    ) -> int:
        """A VXLAN device, learning off, already on bridge ``master`` and up, in one
        message; returns its index."""
        attrs = {
            "ifname": name,
            "kind": "vxlan",
            "vxlan_id": vni,
            "vxlan_local": local,
            "vxlan_port": VXLAN_PORT,
            "vxlan_learning": 0,
            "mtu": mtu,
            "master": master,
            "state": "up",
        }
        if underlay:
            attrs["vxlan_link"] = underlay
        return self._add(f"add vxlan {name}", **attrs)

    def add_tap(self, name: str) -> int:
        """A persistent tap device (down, off any bridge); returns its index."""
        self._write(
            f"add tap {name}", self._ipr.link, "add", ifname=name, kind="tuntap", mode="tap"
        )
        return self.index(name)

    def add_veth(self, name: str, *, peer: str, peer_netns: str, peer_mac: str, mtu: int) -> int:
        """A veth pair whose peer, with ``peer_mac``, is moved into ``peer_netns`` and set up
        there; returns the index of the host side (down, off any bridge)."""
        # The peer is made under a temporary name, unique on this host because it is derived
        # from the port's, and renamed once inside its namespace: its final name (eth0) may
        # well exist in the host's namespace already.
        temp = "nw" + name[2:]
        self._write(
            f"add veth {name}",
            self._ipr.link,
            "add",
            ifname=name,
            kind="veth",
            mtu=mtu,
            peer={"ifname": temp, "mtu": mtu, "address": peer_mac},
        )
        index = self._ipr.link_lookup(ifname=temp)[0]
        self._write(
            f"move {temp} to {peer_netns}",
            self._ipr.link,
            "set",
            index=index,
            net_ns_fd=peer_netns,
        )
        with IPRoute(netns=peer_netns) as inside:
            moved = inside.link_lookup(ifname=temp)[0]
            self._write(
                f"name {peer} in {peer_netns}",
                inside.link,
                "set",
                index=moved,
                ifname=peer,
                state="up",
            )
        return self.index(name)

    def set_link(self, index: int, name: str, **attrs) -> None:
        """``attrs``: master (index), mtu, state ("up")."""
        self._write(f"set {name} {attrs}", self._ipr.link, "set", index=index, **attrs)

    def delete_link(self, index: int, name: str) -> None:
        try:
            self._write(f"delete {name}", self._ipr.link, "del", index=index)
        except NetworkDriverError as e:
            if e.errno != 19:  # ENODEV: already gone (a veth's pair went with its peer)
                raise

    def fdb_add(self, index: int, mac: str, dst: str) -> None:
        self._write(
            f"fdb add {mac} dst {dst}",
            self._ipr.fdb,
            "append",
            ifindex=index,
            lladdr=mac,
            dst=dst,
        )

    def fdb_delete(self, index: int, mac: str, dst: str) -> None:
        self._write(
            f"fdb del {mac} dst {dst}", self._ipr.fdb, "del", ifindex=index, lladdr=mac, dst=dst
        )
