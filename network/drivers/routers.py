"""Project routers on the gateway host: one network namespace per ``Router``.

Inside ``kumo-r-<router id>`` a router has a leg per network (``qr-<vni>``, with the
subnet's gateway address and MAC; its host side ``ri-<vni>`` is on bridge ``br-<vni>``) and,
when it has an external address, a leg on the external network (``qg-0``; host side
``re-<router id>`` on ``HostNetworks.external_bridge``) holding the external address and,
as /32s, every global IP of its 1:1 NAT and port forwards, so it answers ARP for them. Its
default route goes to ``external_gateway``, ``routes`` are static routes, IPv4 forwarding
is on, and one ``ip`` nftables table (``kumo_nat``) does the NAT:

- a port forward DNATs ``global_ip:external_port`` to ``internal_ip:internal_port``;
- a floating IP DNATs to its internal address, and that address leaves as the floating IP
  (taking precedence over plain SNAT);
- anything else from ``snat_cidrs`` leaving on ``qg-0`` leaves as the external address.

Each namespace's ``lo`` carries the alias ``OWNER_PREFIX`` + the host's namespace, so a
resync removes only stale ``kumo-r-*`` namespaces its own host made (tests run several
"hosts" on one machine). Everything is converged from what the kernel shows, so a router
already as desired costs reads only.
"""

from __future__ import annotations

from network.drivers.base import (
    ROUTER_EXT_PREFIX,
    ROUTER_LEG_PREFIX,
    ROUTER_NETNS_PREFIX,
    HostNetworks,
    NetworkDriverError,
    ResyncResult,
    Router,
    bridge_name,
)
from network.drivers.netlink import Link, Netlink, loopback_alias, netns_names
from network.drivers.nft import Nftables, Table

NAT_TABLE = ("ip", "kumo_nat")
EXTERNAL_LEG = "qg-0"
OWNER_PREFIX = "kumo-router of "


def leg_name(vni: int) -> str:
    """The host side of a router's leg on network ``vni``."""
    return f"{ROUTER_LEG_PREFIX}{vni}"


def external_leg_name(router_id: str) -> str:
    """The host side of a router's leg on the external bridge."""
    return ROUTER_EXT_PREFIX + router_id[:12]


def router_devices(desired: HostNetworks) -> set[str]:
    """The host-side devices of every desired router: a resync must keep them."""
    names = {leg_name(i.vni) for r in desired.routers for i in r.interfaces}
    return names | {external_leg_name(r.router_id) for r in desired.routers if r.external_address}


def nat_table(router: Router) -> Table:
    """The router's NAT as one ``ip`` table: port forwards, then 1:1 NAT, then SNAT."""
    dnat, snat = [], []
    for f in sorted(router.forwards, key=repr):
        dnat.append(
            f"ip daddr {f.global_ip} {f.protocol} dport {f.external_port}"
            f" dnat to {f.internal_ip}:{f.internal_port}"
        )
    for global_ip, internal in sorted(router.floating):
        dnat.append(f"ip daddr {global_ip} dnat to {internal}")
        snat.append(f'oifname "{EXTERNAL_LEG}" ip saddr {internal} snat to {global_ip}')
    if router.external_address and router.snat_cidrs:
        cidrs = ", ".join(sorted(router.snat_cidrs))
        external_ip = router.external_address.split("/")[0]
        snat.append(f'oifname "{EXTERNAL_LEG}" ip saddr {{ {cidrs} }} snat to {external_ip}')
    body = (
        "chain prerouting {\n  type nat hook prerouting priority dstnat; policy accept;\n"
        + "".join(f"  {rule}\n" for rule in dnat)
        + "}\nchain postrouting {\n  type nat hook postrouting priority srcnat; policy accept;\n"
        + "".join(f"  {rule}\n" for rule in snat)
        + "}"
    )
    return Table(*NAT_TABLE, body)


def _addresses(router: Router) -> dict[str, set[str]]:
    """The addresses each of the router's inner devices should hold."""
    wanted = {f"qr-{i.vni}": {i.address} for i in router.interfaces}
    if router.external_address:
        own = router.external_address.split("/")[0]
        globals_ = {g for g, _ in router.floating} | {f.global_ip for f in router.forwards}
        wanted[EXTERNAL_LEG] = {router.external_address} | {f"{g}/32" for g in globals_ - {own}}
    return wanted


def _routes(router: Router) -> set[tuple[str, str]]:
    routes = set(router.routes)
    if router.external_gateway:
        routes.add(("0.0.0.0/0", router.external_gateway))
    return routes


class _Namespace:
    """A router's namespace, as netlink and nftables handles opened inside it."""

    def __init__(self, netns: str) -> None:
        self.nl = Netlink(netns)
        self.nft = Nftables(netns)

    @property
    def writes(self) -> int:
        return self.nl.writes + self.nft.writes

    def close(self) -> None:
        self.nft.close()
        self.nl.close()


class Routers:
    """The routers of the host that ``nl`` is on (the gateway host)."""

    def __init__(self, nl: Netlink) -> None:
        self.nl = nl
        self.owner = OWNER_PREFIX + (nl.netns or "-")
        self._open: dict[str, _Namespace] = {}

    def close(self) -> None:
        for namespace in self._open.values():
            namespace.close()
        self._open.clear()

    def sync(self, links: dict[str, Link], desired: HostNetworks, result: ResyncResult) -> int:
        """Converge every router and remove this host's stale ones; returns the writes made
        inside routers' namespaces (the host's own are counted on ``nl``)."""
        existing = set(netns_names())
        writes = 0
        for router in desired.routers:
            writes += self._ensure_router(links, router, desired, existing, result)
        wanted = {r.netns for r in desired.routers}
        for name in sorted(existing - wanted):
            if name.startswith(ROUTER_NETNS_PREFIX) and self._owns(name):
                self._remove(name, result)
        return writes

    # -- one router -------------------------------------------------------------------------

    def _ensure_router(self, links, router: Router, desired, existing, result) -> int:
        if router.netns not in existing:
            self.nl.add_netns(router.netns)
            result.created.append(router.netns)
        if router.netns not in self._open:
            self._open[router.netns] = _Namespace(router.netns)
        inside = self._open[router.netns]
        start = inside.writes
        if inside.nl.alias("lo") != self.owner:
            inside.nl.set_alias(1, "lo", self.owner)
        inner = self._ensure_legs(links, router, desired, inside, result)
        self._sync_addresses(inside.nl, inner, _addresses(router))
        inside.nl.ensure_sysctl("net/ipv4/ip_forward", "1")
        self._sync_routes(inside.nl, _routes(router))
        inside.nft.apply(nat_table(router))
        return inside.writes - start

    def _ensure_legs(self, links, router: Router, desired, inside: _Namespace, result):
        """Every leg a veth pair with its host side up on its bridge and its inner side up
        with its MAC; a pair whose inner side is missing or has another MAC is replaced.
        Returns the namespace's devices."""
        mtus = {n.vni: n.mtu for n in desired.networks}
        legs = [
            (leg_name(i.vni), f"qr-{i.vni}", i.mac, bridge_name(i.vni), mtus[i.vni])
            for i in router.interfaces
        ]
        if router.external_address:
            external = links.get(desired.external_bridge)
            if external is None:
                raise NetworkDriverError(f"external bridge {desired.external_bridge} is missing")
            legs.append(
                (external_leg_name(router.router_id), EXTERNAL_LEG, "", external.name, external.mtu)
            )
        inner = inside.nl.links()
        made = False
        for host_side, peer, mac, bridge, mtu in legs:
            link = links.get(host_side)
            kept = link is not None and link.kind == "veth" and peer in inner
            if kept and (not mac or inner[peer].mac == mac):
                self._ensure_up(self.nl, link, mtu, links[bridge].index)
                continue
            if link is not None:
                self.nl.delete_link(link.index, host_side)
                result.removed.append(host_side)
            self.nl.add_leg(
                host_side,
                peer=peer,
                peer_netns=router.netns,
                peer_mac=mac,
                mtu=mtu,
                master=links[bridge].index,
            )
            result.created.append(host_side)
            made = True
        if made:
            inner = inside.nl.links()
        for _, peer, _, _, mtu in legs:
            self._ensure_up(inside.nl, inner[peer], mtu)
        return inner

    @staticmethod
    def _ensure_up(nl: Netlink, link: Link, mtu: int, master: int | None = None) -> None:
        """``link`` up at ``mtu`` (and on bridge ``master`` when given): one write when
        anything differs."""
        if (link.mtu, link.up) != (mtu, True) or master not in (None, link.master):
            nl.set_link(
                link.index,
                link.name,
                master=master if master != link.master else None,
                mtu=mtu if mtu != link.mtu else None,
                up=not link.up,
            )

    @staticmethod
    def _sync_addresses(nl: Netlink, links: dict[str, Link], wanted: dict[str, set[str]]) -> None:
        current = nl.addresses()
        for name, addresses in wanted.items():
            index = links[name].index
            have = current.get(index, set())
            for address in sorted(addresses - have):
                nl.add_address(index, name, address)
            for address in sorted(have - addresses):
                nl.delete_address(index, name, address)

    @staticmethod
    def _sync_routes(nl: Netlink, wanted: set[tuple[str, str]]) -> None:
        current = nl.gateway_routes()
        for dst, gateway in sorted(current - wanted):
            nl.delete_route(dst, gateway)
        for dst, gateway in sorted(wanted - current):
            nl.add_route(dst, gateway)

    # -- stale routers ----------------------------------------------------------------------

    def _owns(self, netns: str) -> bool:
        """Whether this host made router namespace ``netns``."""
        return loopback_alias(netns) == self.owner

    def _remove(self, netns: str, result: ResyncResult) -> None:
        """Delete the namespace; its inner legs, and with them their host sides, go too."""
        namespace = self._open.pop(netns, None)
        if namespace is not None:
            namespace.close()
        self.nl.delete_netns(netns)
        result.removed.append(netns)
