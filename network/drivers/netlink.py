"""The one module that talks netlink for the host network driver.

The driver's reads and writes speak rtnetlink directly, on a plain ``AF_NETLINK`` socket
with ``struct``: a dump is decoded only as far as the driver reads it (a link's name, index,
flags, MTU, master, address, lower device, kind, VXLAN or VLAN id and SR-IOV VFs; an FDB
entry's device, MAC and remote VTEP), and a write is one pre-built message and its
acknowledgement. The routers' rarer writes go through pyroute2, opened on first use. The
messages' layout, their encoding and decoding are ``network.drivers.netlink_codec``'s (bytes
only); this module sends them and reads the answers.

Reads come back as small dataclasses in one dump each (every link; every VXLAN FDB entry);
every write is counted (``writes``: what a no-change resync must keep at zero) and the
kernel's errno, with its own explanation when it gives one, becomes ``NetworkDriverError``.
``Netlink(netns=…)`` works inside a network namespace, as the tests' hosts are.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from functools import cached_property

from pyroute2 import IPRoute
from pyroute2 import netns as pyroute2_netns
from pyroute2.netlink.exceptions import NetlinkError

from network.drivers.base import VXLAN_PORT, NetworkDriverError
from network.drivers.netlink_codec import (
    _BE16,
    _HEADER,
    _NDMSG,
    _U16,
    _VF_MAC,
    _VF_TRUST,
    _VF_VLAN,
    AF_BRIDGE,
    IFLA_ADDRESS,
    IFLA_EXT_MASK,
    IFLA_IFNAME,
    IFLA_LINK,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_NET_NS_FD,
    IFLA_VF_INFO,
    IFLA_VF_MAC,
    IFLA_VF_TRUST,
    IFLA_VF_VLAN,
    IFLA_VFINFO_LIST,
    IFLA_VLAN_ID,
    IFLA_VXLAN_ID,
    IFLA_VXLAN_LEARNING,
    IFLA_VXLAN_LINK,
    IFLA_VXLAN_LOCAL,
    IFLA_VXLAN_PORT,
    NLM_F_ACK,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTEXT_FILTER_SKIP_STATS,
    RTEXT_FILTER_VF,
    RTM_DELLINK,
    RTM_DELNEIGH,
    RTM_GETLINK,
    RTM_GETNEIGH,
    RTM_NEWLINK,
    RTM_NEWNEIGH,
    VETH_INFO_PEER,
    Link,
    _align,
    _attr,
    _fdb_body,
    _link_body,
    _link_info,
    _mac_bytes,
    _raise_for_errno,
    _string,
    _u32,
    parse_fdb_entry,
    parse_link,
)
from network.drivers.netlink_codec import Vf as Vf  # re-exported with Link: a PF's VFs

SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK = 270, 10, 11

# tun (linux/if_tun.h)
TUNSETIFF, TUNSETPERSIST, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x400454CB, 0x0002, 0x1000

_BUFFER = 1 << 18  # one receive: a dump part is at most 32 KiB, one message far less


@contextlib.contextmanager
def _netns_fd(netns: str) -> Iterator[int]:
    """An open file descriptor of named network namespace ``netns``."""
    try:
        fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY)
    except FileNotFoundError as e:
        raise NetworkDriverError(f"network namespace {netns} is missing", errno=e.errno) from e
    try:
        yield fd
    finally:
        os.close(fd)


class Netlink:
    """A netlink socket on one namespace (the host's own when ``netns`` is empty)."""

    def __init__(self, netns: str = "") -> None:
        self.netns = netns
        self.writes = 0
        self._sock = self._open()
        self._buffer = bytearray(_BUFFER)
        self._seq = 0
        self._next_index = 0  # the index the next device is asked to take (see _add)

    def _open(self) -> socket.socket:
        with netns_entered(self.netns):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)  # acks without the request
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)  # and with the kernel's reason
        sock.bind((0, 0))
        return sock

    @cached_property
    def _ipr(self) -> IPRoute:
        """pyroute2 on the same namespace, for the routers' writes; opened on first use."""
        return IPRoute(netns=self.netns) if self.netns else IPRoute()

    def close(self) -> None:
        self._sock.close()
        if "_ipr" in self.__dict__:
            self._ipr.close()

    # -- reads ------------------------------------------------------------------------------

    def links(self) -> dict[str, Link]:
        """Every device of the namespace by name, in one dump (VFs included)."""
        request = _link_body(attrs=_u32(IFLA_EXT_MASK, RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS))
        found = {}
        for data, start, end in self._exchange("dump links", RTM_GETLINK, NLM_F_DUMP, request):
            link = parse_link(data, start, end)
            found[link.name] = link
        self._next_index = max((link.index for link in found.values()), default=0) + 1
        return found

    def vxlan_fdb(self) -> dict[int, set[tuple[str, str]]]:
        """Static remote entries (MAC, VTEP) of every VXLAN device, by device index."""
        request = _NDMSG.pack(AF_BRIDGE, 0, 0, 0, 0)
        entries: dict[int, set[tuple[str, str]]] = {}
        for data, start, end in self._exchange("dump fdb", RTM_GETNEIGH, NLM_F_DUMP, request):
            entry = parse_fdb_entry(data, start, end)
            if entry is not None:
                index, mac, dst = entry
                entries.setdefault(index, set()).add((mac, dst))
        return entries

    def sriov_pfs(self) -> dict[str, int]:
        """Every SR-IOV physical function of the namespace: netdev name -> number of VFs."""
        return {link.name: link.num_vfs for link in self.links().values() if link.num_vfs}

    def index(self, name: str) -> int:
        """The index of device ``name`` (one read); NetworkDriverError (ENODEV) when there
        is none."""
        request = _link_body(attrs=_string(IFLA_IFNAME, name))
        found = [
            parse_link(data, start, end).index
            for data, start, end in self._exchange(f"find {name}", RTM_GETLINK, 0, request)
        ]
        return found[0]

    # -- writes -----------------------------------------------------------------------------

    def _send(self, what: str, kind: int, flags: int, body: bytes) -> None:
        """Send one request, counted, and wait for its acknowledgement."""
        self.writes += 1
        for _ in self._exchange(what, kind, flags, body):
            pass

    def _add(self, what: str, name: str, attrs: bytes) -> int:
        """Make device ``name``, up, and return its index. The index is chosen here, past
        every index the last dump saw, so no read is needed to learn it; should something
        else have taken it meanwhile (EEXIST), the kernel picks one and it is looked up."""
        create = NLM_F_CREATE | NLM_F_EXCL
        attrs = _string(IFLA_IFNAME, name) + attrs
        if self._next_index:
            index, self._next_index = self._next_index, self._next_index + 1
            try:
                self._send(what, RTM_NEWLINK, create, _link_body(index, up=True, attrs=attrs))
                return index
            except NetworkDriverError as e:
                if e.errno != errno.EEXIST or self._exists(name):
                    raise  # not the index's fault: the name is taken, or another error
        self._send(what, RTM_NEWLINK, create, _link_body(up=True, attrs=attrs))
        return self.index(name)

    def _exists(self, name: str) -> bool:
        try:
            self.index(name)
        except NetworkDriverError as e:
            if e.errno == errno.ENODEV:
                return False
            raise
        return True

    def add_bridge(self, name: str, mtu: int) -> int:
        """A bridge, up; returns its index."""
        return self._add(f"add bridge {name}", name, _u32(IFLA_MTU, mtu) + _link_info("bridge"))

    def add_vxlan(
        self, name: str, *, vni: int, local: str, mtu: int, master: int, underlay: int = 0
    ) -> int:
        """A VXLAN device, learning off, already on bridge ``master`` and up, in one
        message; returns its index."""
        data = (
            _u32(IFLA_VXLAN_ID, vni)
            + _attr(IFLA_VXLAN_LOCAL, socket.inet_aton(local))
            + _attr(IFLA_VXLAN_PORT, _BE16.pack(VXLAN_PORT))
            + _attr(IFLA_VXLAN_LEARNING, b"\0")
            + (_u32(IFLA_VXLAN_LINK, underlay) if underlay else b"")
        )
        attrs = _u32(IFLA_MTU, mtu) + _u32(IFLA_MASTER, master) + _link_info("vxlan", data)
        return self._add(f"add vxlan {name}", name, attrs)

    def add_vlan(self, name: str, *, vlan: int, trunk: int, mtu: int, master: int) -> int:
        """A VLAN device of id ``vlan`` on device ``trunk``, already on bridge ``master``
        and up, in one message; returns its index."""
        attrs = (
            _u32(IFLA_LINK, trunk)
            + _u32(IFLA_MTU, mtu)
            + _u32(IFLA_MASTER, master)
            + _link_info("vlan", _attr(IFLA_VLAN_ID, _U16.pack(vlan)))
        )
        return self._add(f"add vlan {name} id {vlan}", name, attrs)

    def add_tap(self, name: str) -> int:
        """A persistent tap device (down, off any bridge); returns its index. A tap is made
        through /dev/net/tun, not netlink, and counts as one write all the same."""
        self.writes += 1
        request = struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI)  # struct ifreq
        try:
            with netns_entered(self.netns):
                fd = os.open("/dev/net/tun", os.O_RDWR)  # the tap is made in fd's namespace
            try:
                fcntl.ioctl(fd, TUNSETIFF, request)
                fcntl.ioctl(fd, TUNSETPERSIST, 1)
            finally:
                os.close(fd)
        except OSError as e:
            raise NetworkDriverError(f"add tap {name}: {e.strerror}", errno=e.errno) from e
        return self.index(name)

    def add_veth(self, name: str, *, peer: str, peer_netns: str, peer_mac: str, mtu: int) -> int:
        """A veth pair: ``name`` here (down, off any bridge) and ``peer`` with ``peer_mac``
        made straight in ``peer_netns`` in the same message, then set up there (a veth
        cannot be opened before its pair exists); returns the index of ``name``."""
        with _netns_fd(peer_netns) as fd:
            peer_attrs = (
                _string(IFLA_IFNAME, peer)
                + _attr(IFLA_ADDRESS, _mac_bytes(peer_mac))
                + _u32(IFLA_MTU, mtu)
                + _u32(IFLA_NET_NS_FD, fd)
            )
            data = _attr(VETH_INFO_PEER, _link_body(attrs=peer_attrs))
            attrs = _string(IFLA_IFNAME, name) + _u32(IFLA_MTU, mtu) + _link_info("veth", data)
            create = NLM_F_CREATE | NLM_F_EXCL
            self._send(f"add veth {name}", RTM_NEWLINK, create, _link_body(attrs=attrs))
        inside = Netlink(peer_netns)
        try:
            up = _link_body(up=True, attrs=_string(IFLA_IFNAME, peer))  # found by its name
            inside._send(f"set {peer} up in {peer_netns}", RTM_NEWLINK, 0, up)
        finally:
            self.writes += inside.writes
            inside.close()
        return self.index(name)

    def set_link(
        self, index: int, name: str, *, master: int | None = None, mtu: int | None = None,
        up: bool = False,
    ) -> None:  # fmt: skip
        """In one message: onto bridge ``master``, MTU ``mtu``, up when ``up``; what is
        None (or False) stays as it is."""
        attrs = b"".join(
            _u32(kind, value) for kind, value in ((IFLA_MASTER, master), (IFLA_MTU, mtu))
            if value is not None
        )  # fmt: skip
        what = f"set {name} master={master} mtu={mtu} up={up}"
        self._send(what, RTM_NEWLINK, 0, _link_body(index, up=up, attrs=attrs))

    def set_vf(self, pf: Link, vf: int, *, mac: str, vlan: int) -> None:
        """VF ``vf`` of physical function ``pf``: its MAC, its VLAN (0: untagged) and trust
        on, in one message (``ip link set PF vf N mac M vlan V trust on``)."""
        info = (
            _attr(IFLA_VF_MAC, _VF_MAC.pack(vf, _mac_bytes(mac)))
            + _attr(IFLA_VF_VLAN, _VF_VLAN.pack(vf, vlan, 0))
            + _attr(IFLA_VF_TRUST, _VF_TRUST.pack(vf, 1))
        )
        body = _link_body(pf.index, attrs=_attr(IFLA_VFINFO_LIST, _attr(IFLA_VF_INFO, info)))
        what = f"set {pf.name} vf {vf} mac {mac} vlan {vlan} trust on"
        self._send(what, RTM_NEWLINK, 0, body)

    def move_to_netns(self, index: int, name: str, netns: str) -> None:
        """Move device ``name`` into named namespace ``netns`` (``ip link set … netns``). A
        tap keeps its queue and the file descriptors open on it (a QEMU that holds it keeps
        working); it arrives down and off any bridge."""
        with _netns_fd(netns) as fd:
            self._send(
                f"move {name} to netns {netns}",
                RTM_NEWLINK,
                0,
                _link_body(index, attrs=_u32(IFLA_NET_NS_FD, fd)),
            )

    def delete_link(self, index: int, name: str) -> None:
        """Delete a device; one already gone (a veth's pair goes with its peer) is fine."""
        try:
            self._send(f"delete {name}", RTM_DELLINK, 0, _link_body(index))
        except NetworkDriverError as e:
            if e.errno != errno.ENODEV:
                raise

    def fdb_add(self, index: int, mac: str, dst: str) -> None:
        append = NLM_F_CREATE | NLM_F_APPEND
        self._send(f"fdb add {mac} dst {dst}", RTM_NEWNEIGH, append, _fdb_body(index, mac, dst))

    def fdb_delete(self, index: int, mac: str, dst: str) -> None:
        self._send(f"fdb del {mac} dst {dst}", RTM_DELNEIGH, 0, _fdb_body(index, mac, dst))

    def _write(self, what: str, fn, *args, **kwargs):
        """One pyroute2 call that writes, counted, its errno as NetworkDriverError."""
        self.writes += 1
        try:
            return fn(*args, **kwargs)
        except NetlinkError as e:
            raise NetworkDriverError(f"{what}: {e}", errno=e.code) from e

    # -- the wire ---------------------------------------------------------------------------

    def _exchange(
        self, what: str, kind: int, flags: int, body: bytes
    ) -> Iterator[tuple[bytearray, int, int]]:
        """Send one request and yield each message of its answer as (buffer, start of its
        payload, end) until the acknowledgement or the end of the dump, which raises
        NetworkDriverError when it carries an error. The buffer is reused by the next
        receive: decode a message before asking for the next. An answer left unread (an
        error while decoding it) costs the socket: a new one is opened, so no half-read
        dump is in the way of the next request (the kernel runs one dump at a time)."""
        self._seq += 1
        seq, flags = self._seq, NLM_F_REQUEST | NLM_F_ACK | flags
        message = _HEADER.pack(_HEADER.size + len(body), kind, flags, seq, 0) + body
        read = False
        try:
            self._sock.send(message)
            while not read:
                size, offset = self._sock.recv_into(self._buffer), 0
                while offset < size and not read:
                    length, kind, flags, _, _ = _HEADER.unpack_from(self._buffer, offset)
                    if length < _HEADER.size or offset + length > size:
                        raise NetworkDriverError(f"{what}: truncated netlink answer")
                    start, end = offset + _HEADER.size, offset + length
                    offset += _align(length)
                    read = kind in (NLMSG_ERROR, NLMSG_DONE)
                    if read:
                        _raise_for_errno(what, kind, flags, self._buffer, start, end)
                    else:
                        yield self._buffer, start, end
        except OSError as e:
            raise NetworkDriverError(f"{what}: {e.strerror}", errno=e.errno) from e
        finally:
            if not read:
                self._sock.close()
                self._sock = self._open()

    # -- addresses, routes and namespaces (routers) -----------------------------------------

    def addresses(self) -> dict[int, set[str]]:
        """Every IPv4 address (``a.b.c.d/len``), by device index, in one dump."""
        found: dict[int, set[str]] = {}
        for msg in self._ipr.get_addr(family=socket.AF_INET):
            address = f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}"
            found.setdefault(msg["index"], set()).add(address)
        return found

    def gateway_routes(self) -> set[tuple[str, str]]:
        """The main table's IPv4 routes through a next hop: (destination CIDR, gateway)."""
        found = set()
        for msg in self._ipr.get_routes(family=socket.AF_INET, table=254):
            gateway = msg.get("RTA_GATEWAY")
            if gateway:
                found.add((f"{msg.get('RTA_DST') or '0.0.0.0'}/{msg['dst_len']}", gateway))
        return found

    def add_address(self, index: int, name: str, address: str) -> None:
        ip, length = address.split("/")
        self._write(
            f"add {address} to {name}", self._ipr.addr, "add", index=index, address=ip,
            prefixlen=int(length),
        )  # fmt: skip

    def delete_address(self, index: int, name: str, address: str) -> None:
        ip, length = address.split("/")
        self._write(
            f"delete {address} from {name}", self._ipr.addr, "del", index=index, address=ip,
            prefixlen=int(length),
        )  # fmt: skip

    def add_route(self, dst: str, gateway: str) -> None:
        self._write(f"route {dst} via {gateway}", self._ipr.route, "add", dst=dst, gateway=gateway)

    def delete_route(self, dst: str, gateway: str) -> None:
        self._write(
            f"delete route {dst} via {gateway}", self._ipr.route, "del", dst=dst, gateway=gateway
        )

    def add_leg(
        self, name: str, *, peer: str, peer_netns: str, peer_mac: str, mtu: int, master: int
    ) -> None:
        """A veth pair in one message: ``name`` here, up on bridge ``master`` (0: none),
        and ``peer`` with ``peer_mac`` (the kernel's choice when "") made straight in
        ``peer_netns`` (still down there)."""
        self._write(
            f"add veth {name} to {peer_netns}",
            self._ipr.link,
            "add",
            ifname=name,
            kind="veth",
            mtu=mtu,
            state="up",
            **({"master": master} if master else {}),
            peer={
                "ifname": peer,
                "net_ns_fd": f"{NETNS_DIR}/{peer_netns}",
                "mtu": mtu,
                **({"address": peer_mac} if peer_mac else {}),
            },
        )

    def set_alias(self, index: int, name: str, alias: str) -> None:
        self._write(f"alias {name} {alias!r}", self._ipr.link, "set", index=index, ifalias=alias)

    def alias(self, name: str) -> str:
        """The alias of device ``name`` ("" when it has none)."""
        msg = self._ipr.get_links(ifname=name)[0]
        return msg.get("IFLA_IFALIAS") or ""

    def ensure_sysctl(self, key: str, value: str) -> None:
        """Set ``/proc/sys/<key>`` of this namespace to ``value``; a write only when it
        differs."""
        path = f"/proc/sys/{key}"
        with netns_entered(self.netns):
            with open(path) as f:
                if f.read().strip() == value:
                    return
            self.writes += 1
            try:
                with open(path, "w") as f:
                    f.write(value)
            except OSError as e:
                raise NetworkDriverError(f"sysctl {key}={value}: {e}", errno=e.errno) from e

    def add_netns(self, name: str) -> None:
        """A named network namespace (``ip netns add``), with its loopback up.

        Made as ``ip netns add`` makes it (a new namespace, bound to ``/run/netns/<name>``),
        by a short-lived thread of this process: a thread's network namespace is its own.
        pyroute2's ``netns.create`` forks a child for it and waits 2 s for its answer; an
        agent's large process forked on a loaded host can take longer ("no response from
        the child"), and the namespace is then not made."""
        self.writes += 1
        failed: list[OSError] = []

        def made_inside() -> None:
            try:
                if _libc.unshare(_CLONE_NEWNET):
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
                pyroute2_netns.attach(name, "thread-self")  # binds /proc/thread-self/ns/net
            except OSError as e:
                failed.append(e)

        thread = threading.Thread(target=made_inside, name=f"netns {name}")
        thread.start()
        thread.join()
        if failed:
            error = failed[0]
            raise NetworkDriverError(f"add netns {name}: {error}", errno=error.errno) from error
        inside = Netlink(name)
        try:
            inside.set_link(1, "lo", up=True)
        finally:
            self.writes += inside.writes
            inside.close()

    def delete_netns(self, name: str) -> None:
        """Remove a named namespace; every device in it goes with it (a veth's peer too).
        A process still inside (a resolver whose folder this agent no longer knows, as after
        a change of ``KUMO_VAR_DIR``) is stopped first: it would keep the namespace alive,
        unnamed and unreachable, as long as it runs."""
        self.writes += 1
        for pid in netns_pids(name):
            stop(pid)
        try:
            pyroute2_netns.remove(name)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise NetworkDriverError(f"delete netns {name}: {e}", errno=e.errno) from e


NETNS_DIR = "/var/run/netns"
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def loopback_alias(netns: str) -> str | None:
    """The alias of ``lo`` in namespace ``netns``; None when the namespace is gone. Unlike
    pyroute2's default, this never creates the namespace it looks into."""
    try:
        with IPRoute(netns=netns, flags=0) as ipr:
            return ipr.get_links(ifname="lo")[0].get("IFLA_IFALIAS") or ""
    except (OSError, NetlinkError):
        return None


def netns_pids(name: str) -> list[int]:
    """The processes inside named namespace ``name`` (as ``ip netns pids``)."""
    try:
        inode = os.stat(f"{NETNS_DIR}/{name}").st_ino
    except OSError:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry.name}/ns/net").st_ino == inode:
                    pids.append(int(entry.name))
    return pids


def stop(pid: int, timeout: float = 3.0) -> None:
    """SIGTERM, then SIGKILL past ``timeout``; a process already gone is success."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}") or _zombie(pid):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def netns_names() -> list[str]:
    """The named network namespaces of the machine (``ip netns list``)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def netns_entered(netns: str):
    """Run the block with the calling thread in namespace ``netns`` (no change when empty):
    sockets opened and ``/proc/sys/net`` files read there belong to it. The thread's own
    namespace is restored on the way out, whatever happens."""
    if not netns:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"{NETNS_DIR}/{netns}", os.O_RDONLY)
        try:
            if _libc.setns(target, _CLONE_NEWNET):
                err = ctypes.get_errno()
                raise NetworkDriverError(f"enter netns {netns}: {os.strerror(err)}", errno=err)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _libc.setns(home, _CLONE_NEWNET)
    finally:
        os.close(home)
