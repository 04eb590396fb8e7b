"""Project networks' resolvers on the gateway host: one dnsmasq per network.

A network's dnsmasq (``DnsService``) listens on the network's gateway addresses: inside
the project's router namespace when the project has a router (its legs hold them
already; dnsmasq reaches the upstream servers through the router's external leg), else
inside the network's own namespace ``kumo-d-<network id>``, on a leg ``qd-<vni>`` (host
side ``di-<vni>`` on ``br-<vni>``) that this module makes and gives the gateway addresses.
Each dnsmasq only ever holds its own project's names and listens only in its own namespace,
so no project can read another's names, even at the same address.

Each service has a folder ``<state_dir>/<network id>/`` with its ``dnsmasq.conf`` (what
dnsmasq is started with), ``hosts`` (the names; re-read on SIGHUP), ``servers`` (the
upstreams; re-read on SIGHUP) and ``dnsmasq.pid``. A resync writes a file only when its
text changed; a changed ``hosts`` or ``servers`` costs one SIGHUP, a changed
``dnsmasq.conf`` (listen addresses, domain) or a process in the wrong namespace one
restart. A running dnsmasq is found from ``/proc`` (its ``--conf-file`` names its folder),
not from memory, so an agent that restarts adopts the processes it finds; dnsmasq runs as
its own daemon in its own session, so it keeps answering while the agent is down. A
folder or process no desired service names is stopped and removed, with its namespace.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
from pathlib import Path

from network.drivers.base import (
    DNS_LEG_PREFIX,
    DNS_NETNS_PREFIX,
    DnsService,
    HostNetworks,
    NetworkDriverError,
    ResyncResult,
    bridge_name,
)
from network.drivers.netlink import (
    NETNS_DIR,
    Link,
    Netlink,
    loopback_alias,
    netns_entered,
    netns_names,
    stop,
)

log = logging.getLogger(__name__)

OWNER_PREFIX = "kumo-dns of "
DNSMASQ = os.environ.get("KUMO_DNSMASQ", "dnsmasq")
CONF, HOSTS, SERVERS, PID = "dnsmasq.conf", "hosts", "servers", "dnsmasq.pid"
LOG, ERRORS = "dnsmasq.log", "dnsmasq.err"


def leg_name(vni: int) -> str:
    """The host side of a DNS namespace's leg on network ``vni``."""
    return f"{DNS_LEG_PREFIX}{vni}"


def inner_name(vni: int) -> str:
    return f"qd-{vni}"


def dns_devices(desired: HostNetworks) -> set[str]:
    """The host-side devices of every desired DNS namespace: a resync must keep them."""
    return {leg_name(d.vni) for d in desired.dns if not d.router_id}


def host_upstreams(path: str = "/etc/resolv.conf") -> tuple[str, ...]:
    """The host's own IPv4 nameservers, loopback ones left out (a stub resolver on the
    host's 127.0.0.x is not reachable from a namespace)."""
    found = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return ()
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and parts[1].count(".") == 3:
            found.append(parts[1])
    return tuple(dict.fromkeys(a for a in found if not a.startswith("127.")))


def config_text(service: DnsService, folder: Path) -> str:
    """dnsmasq's configuration for ``service``: only its own addresses, no DHCP, no host
    files but its own, authority for the whole internal domain (so another project's zone
    is NXDOMAIN here, never forwarded), privileges dropped to nobody."""
    parent = service.domain.split(".", 1)[1] if "." in service.domain else service.domain
    lines = [
        f"# Kumo: the resolver of network {service.network_id} (VNI {service.vni}),",
        "# written by the network agent; changes here are overwritten.",
        "port=53",
        *(f"listen-address={a.split('/')[0]}" for a in service.addresses),
        "bind-interfaces",
        "no-resolv",
        "no-hosts",
        "no-poll",
        "domain-needed",
        "bogus-priv",
        f"domain={service.domain}",
        f"local=/{parent}/",
        f"addn-hosts={folder / HOSTS}",
        f"servers-file={folder / SERVERS}",
        f"pid-file={folder / PID}",
        "user=nobody",
        "group=nogroup",
        "cache-size=1000",
        f"log-facility={folder / LOG}",
    ]
    return "\n".join(lines) + "\n"


def hosts_text(service: DnsService) -> str:
    return "".join(
        f"{address} {name}.{service.domain} {name}\n" for address, name in sorted(service.hosts)
    )


def servers_text(upstreams: tuple[str, ...]) -> str:
    return "".join(f"server={server}\n" for server in upstreams)


def running(state_dir: Path) -> dict[str, int]:
    """The dnsmasq processes started from folders under ``state_dir``: {network id: pid}."""
    marker = f"--conf-file={state_dir}/".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            if arg.startswith(marker):
                network_id = arg[len(marker) :].split(b"/")[0].decode()
                found[network_id] = int(entry.name)
    return found


def traversable(folder: Path) -> bool:
    """Whether any user can reach ``folder``: it and every folder above it searchable by
    others."""
    return all(p.stat().st_mode & 0o001 for p in (folder, *folder.parents))


def gratuitous_arp(device: str, mac: str, address: str) -> None:
    """Broadcast one ARP request for ``address`` from ``address`` at ``mac`` on ``device``
    (of the calling thread's namespace): neighbours replace their entry for it."""
    own = bytes.fromhex(mac.replace(":", ""))
    ip = socket.inet_aton(address)
    frame = (
        b"\xff" * 6 + own + struct.pack("!H", 0x0806)
        + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + own + ip + b"\x00" * 6 + ip
    )  # fmt: skip
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind((device, 0))
        s.send(frame)


def _netns_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class DnsServices:
    """The resolvers of the host that ``nl`` is on (the gateway host), with their files
    under ``state_dir``."""

    def __init__(self, nl: Netlink, state_dir: Path) -> None:
        self.nl = nl
        self.state_dir = Path(state_dir)
        self.owner = OWNER_PREFIX + (nl.netns or "-")
        self.writes = 0
        self._inside: dict[str, Netlink] = {}
        self._warned = False

    def close(self) -> None:
        for inside in self._inside.values():
            inside.close()
        self._inside.clear()

    # -- before the routers: what must go -------------------------------------------------

    def remove_stale(self, desired: HostNetworks, result: ResyncResult) -> None:
        """Stop dnsmasq processes and remove folders and own namespaces no desired service
        names (before the routers converge: a network whose project just got a router
        frees its gateway addresses here before the router's leg takes them)."""
        wanted = {d.network_id: d for d in desired.dns}
        for network_id, pid in running(self.state_dir).items():
            service = wanted.get(network_id)
            if service is None or not self._in_netns(pid, service.netns):
                log.info("dnsmasq of network %s (pid %d) stopped", network_id, pid)
                stop(pid)
                self.writes += 1
        if self.state_dir.is_dir():
            for folder in self.state_dir.iterdir():
                if folder.is_dir() and folder.name not in wanted:
                    shutil.rmtree(folder, ignore_errors=True)
                    self.writes += 1
        own = {d.netns for d in desired.dns if not d.router_id}
        for name in netns_names():
            if name.startswith(DNS_NETNS_PREFIX) and name not in own and self._owns(name):
                inside = self._inside.pop(name, None)
                if inside is not None:
                    inside.close()
                self.nl.delete_netns(name)
                result.removed.append(name)

    # -- after the routers: what must be ------------------------------------------------------

    def sync(self, links: dict[str, Link], desired: HostNetworks, result: ResyncResult) -> None:
        """Every desired resolver: its own namespace (when it has no router), its files,
        and its dnsmasq running in the right namespace."""
        if not desired.dns:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o755)  # dnsmasq re-reads its files as nobody
        if not self._warned and not traversable(self.state_dir):
            self._warned = True
            log.error(
                "dnsmasq re-reads its files as nobody, who cannot reach %s (a folder above it "
                "is not world-searchable): names added from now on will not be answered",
                self.state_dir,
            )
        mtus = {n.vni: n.mtu for n in desired.networks}
        existing = set(netns_names())
        pids = running(self.state_dir)
        fallback = None
        for service in desired.dns:
            if not service.router_id:
                self._ensure_namespace(links, service, mtus[service.vni], existing, result)
            upstreams = service.upstreams
            if not upstreams:
                fallback = host_upstreams() if fallback is None else fallback
                upstreams = fallback
            self._ensure_dnsmasq(service, upstreams, pids.get(service.network_id))

    def _ensure_namespace(self, links, service: DnsService, mtu: int, existing, result) -> None:
        netns = service.netns
        if netns not in existing:
            self.nl.add_netns(netns)
            result.created.append(netns)
        inside = self._inside.get(netns)
        if inside is None:
            inside = self._inside[netns] = Netlink(netns)
        start = inside.writes
        if inside.alias("lo") != self.owner:
            inside.set_alias(1, "lo", self.owner)
        host_side, peer = leg_name(service.vni), inner_name(service.vni)
        bridge = links[bridge_name(service.vni)]
        inner = inside.links()
        link = links.get(host_side)
        kept = link is not None and link.kind == "veth" and peer in inner
        if not (kept and inner[peer].mac == service.mac):
            if link is not None:
                self.nl.delete_link(link.index, host_side)
                result.removed.append(host_side)
            self.nl.add_leg(
                host_side, peer=peer, peer_netns=netns, peer_mac=service.mac, mtu=mtu,
                master=bridge.index,
            )  # fmt: skip
            result.created.append(host_side)
            inner = inside.links()
        else:
            _ensure_up(self.nl, link, mtu, bridge.index)
        _ensure_up(inside, inner[peer], mtu)
        have = inside.addresses().get(inner[peer].index, set())
        want = set(service.addresses)
        for address in sorted(want - have):
            inside.add_address(inner[peer].index, peer, address)
        for address in sorted(have - want):
            inside.delete_address(inner[peer].index, peer, address)
        self.writes += inside.writes - start

    def _ensure_dnsmasq(self, service: DnsService, upstreams, pid: int | None) -> None:
        folder = self.state_dir / service.network_id
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)
        hosts_changed = self._write(folder / HOSTS, hosts_text(service))
        servers_changed = self._write(folder / SERVERS, servers_text(upstreams))
        conf_changed = self._write(folder / CONF, config_text(service, folder))
        if pid is not None and (conf_changed or not self._in_netns(pid, service.netns)):
            stop(pid)
            self.writes += 1
            pid = None
        if pid is None:
            self._start(service, folder)
        elif servers_changed or hosts_changed:
            os.kill(pid, signal.SIGHUP)
            self.writes += 1

    def _write(self, path: Path, text: str) -> bool:
        """Write ``text`` to ``path`` (atomically) unless it holds it already."""
        try:
            if path.read_text() == text:
                return False
        except OSError:
            pass
        temporary = path.with_name(path.name + ".new")
        temporary.write_text(text)
        temporary.chmod(0o644)
        temporary.replace(path)
        self.writes += 1
        return True

    def _start(self, service: DnsService, folder: Path) -> None:
        """Start dnsmasq in the service's namespace as a daemon of its own session;
        dnsmasq's parent exits once the daemon is listening, with its error if not."""
        argv = ["ip", "netns", "exec", service.netns, DNSMASQ, f"--conf-file={folder / CONF}"]
        # No pipes: the daemon inherits whatever it is given, and a pipe would stay open.
        errors = folder / ERRORS
        try:
            with open(errors, "w") as err:
                done = subprocess.run(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    timeout=15, start_new_session=True,
                )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NetworkDriverError(f"dnsmasq of VNI {service.vni} did not start: {e}") from e
        self.writes += 1
        if done.returncode != 0:
            raise NetworkDriverError(
                f"dnsmasq of VNI {service.vni} did not start: {errors.read_text().strip()}"
            )
        log.info("dnsmasq of network %s started in %s", service.network_id, service.netns)
        self._announce(service)

    def _announce(self, service: DnsService) -> None:
        """Gratuitous ARP for the resolver's addresses from the device now holding them:
        when a network's resolver moves (its project got a router), guests update the
        gateway's MAC at once instead of after their ARP entry goes stale."""
        device = f"qr-{service.vni}" if service.router_id else inner_name(service.vni)
        inside = Netlink(service.netns)
        try:
            link = inside.links().get(device)
            if link is None or not link.mac:
                return
            with netns_entered(service.netns):
                for address in service.addresses:
                    gratuitous_arp(device, link.mac, address.split("/")[0])
        except (OSError, NetworkDriverError) as e:
            log.warning("no gratuitous ARP for VNI %d: %s", service.vni, e)
        finally:
            inside.close()

    @staticmethod
    def _in_netns(pid: int, netns: str) -> bool:
        mine = _netns_inode(f"/proc/{pid}/ns/net")
        return mine is not None and mine == _netns_inode(f"{NETNS_DIR}/{netns}")

    def _owns(self, netns: str) -> bool:
        return loopback_alias(netns) == self.owner


def _ensure_up(nl: Netlink, link: Link, mtu: int, master: int | None = None) -> None:
    if (link.mtu, link.up) != (mtu, True) or master not in (None, link.master):
        nl.set_link(
            link.index,
            link.name,
            master=master if master != link.master else None,
            mtu=mtu if mtu != link.mtu else None,
            up=not link.up,
        )
