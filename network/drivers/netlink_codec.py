"""How rtnetlink messages are laid out, for ``network.drivers.netlink``: the kernel's
constants and structures, the decoding of a link or an FDB entry from a dump (only as far as
the driver reads it: see ``Link``), of an acknowledgement's errno, and the encoding of the
attributes and bodies the driver's writes send. Functions of bytes only: nothing here opens
a socket or touches a namespace; ``tests/network/test_netlink.py`` checks both directions
against pyroute2's own encoder and decoder.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

from network.drivers.base import NetworkDriverError

AF_BRIDGE = getattr(socket, "AF_BRIDGE", 7)

# nlmsghdr types and flags (linux/netlink.h, linux/rtnetlink.h)
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWNEIGH, RTM_DELNEIGH, RTM_GETNEIGH = 28, 29, 30
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLM_F_EXCL, NLM_F_CREATE, NLM_F_APPEND = 0x200, 0x400, 0x800
NLM_F_ACK_TLVS, NLMSGERR_ATTR_MSG = 0x200, 1
NLA_TYPE_MASK = 0x3FFF

# ifinfomsg attributes (linux/if_link.h)
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_MASTER = 1, 3, 4, 5, 10
IFLA_LINKINFO, IFLA_NUM_VF, IFLA_VFINFO_LIST, IFLA_NET_NS_FD, IFLA_EXT_MASK = 18, 21, 22, 28, 29
IFLA_CARRIER = 33
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_VXLAN_ID, IFLA_VXLAN_LINK, IFLA_VXLAN_LOCAL, IFLA_VXLAN_LEARNING = 1, 3, 4, 7
IFLA_VXLAN_PORT = 15  # network byte order
IFLA_VLAN_ID = 1
VETH_INFO_PEER = 1
IFLA_VF_INFO, IFLA_VF_MAC, IFLA_VF_VLAN, IFLA_VF_TRUST = 1, 1, 2, 9
RTEXT_FILTER_VF, RTEXT_FILTER_SKIP_STATS = 1 << 0, 1 << 3
IFF_UP = 0x1

# ndmsg (linux/neighbour.h)
NDA_DST, NDA_LLADDR = 1, 2
NUD_NOARP, NUD_PERMANENT, NTF_SELF = 0x40, 0x80, 0x02

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_NDMSG = struct.Struct("=BxxxiHBB")  # ndmsg: family, ifindex, state, flags, type
_ATTR = struct.Struct("=HH")  # nlattr: length, type
_ERRNO, _U16, _U32, _BE16 = (
    struct.Struct("=i"),
    struct.Struct("=H"),
    struct.Struct("=I"),
    struct.Struct("!H"),
)
_VF_MAC, _VF_VLAN, _VF_TRUST = struct.Struct("=I32s"), struct.Struct("=III"), struct.Struct("=II")
_LINK_ATTRS = frozenset(
    {IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_MASTER, IFLA_LINKINFO}
    | {IFLA_NUM_VF, IFLA_VFINFO_LIST, IFLA_CARRIER}
)
_FDB_ATTRS = frozenset({NDA_DST, NDA_LLADDR})


@dataclass(frozen=True)
class Vf:
    """One SR-IOV virtual function as its physical function reports it."""

    index: int
    mac: str
    vlan: int
    trusted: bool


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str  # vxlan, bridge, veth, tun, vlan, ... ("" for a plain device)
    master: int  # the bridge's index, 0 when not enslaved
    up: bool
    mtu: int
    mac: str
    vni: int | None = None
    vlan: int | None = None  # a VLAN device's id
    lower: int = 0  # IFLA_LINK: a VLAN device's trunk, a veth's peer (0: none)
    num_vfs: int = 0  # an SR-IOV physical function's VFs
    vfs: tuple[Vf, ...] = ()
    carrier: bool = False  # a tap: some open file holds it (a guest's QEMU, up or down)


# -- decoding -------------------------------------------------------------------------------


def parse_link(data, start: int, end: int) -> Link:
    """One RTM_NEWLINK message's payload (``data[start:end]``) as a ``Link``."""
    _, _, index, flags, _ = _IFINFO.unpack_from(data, start)
    attrs = _attrs(data, start + _IFINFO.size, end, _LINK_ATTRS)
    info = _attrs(attrs.get(IFLA_LINKINFO, b""))
    kind = _text(info.get(IFLA_INFO_KIND, b""))
    details = _attrs(info.get(IFLA_INFO_DATA, b""))
    address = attrs.get(IFLA_ADDRESS, b"")
    return Link(
        index=index,
        name=_text(attrs[IFLA_IFNAME]),
        kind=kind,
        master=_u32_of(attrs, IFLA_MASTER),
        up=bool(flags & IFF_UP),
        mtu=_u32_of(attrs, IFLA_MTU),
        mac=address.hex(":") if len(address) == 6 else "",
        vni=_u32_of(details, IFLA_VXLAN_ID) if kind == "vxlan" else None,
        vlan=_U16.unpack_from(details[IFLA_VLAN_ID])[0] if kind == "vlan" else None,
        lower=_u32_of(attrs, IFLA_LINK),
        num_vfs=_u32_of(attrs, IFLA_NUM_VF),
        vfs=_parse_vfs(attrs.get(IFLA_VFINFO_LIST, b"")),
        carrier=attrs.get(IFLA_CARRIER, b"\0") != b"\0",
    )


def _parse_vfs(payload: bytes) -> tuple[Vf, ...]:
    vfs = []
    for _, entry in _attr_list(payload):
        info = _attrs(entry)
        index, mac = _VF_MAC.unpack_from(info[IFLA_VF_MAC])
        vlan = _VF_VLAN.unpack_from(info[IFLA_VF_VLAN])[1]
        trust = _VF_TRUST.unpack_from(info[IFLA_VF_TRUST])[1] if IFLA_VF_TRUST in info else 0
        vfs.append(Vf(index=index, mac=mac[:6].hex(":"), vlan=vlan, trusted=trust == 1))
    return tuple(vfs)


def parse_fdb_entry(data, start: int, end: int) -> tuple[int, str, str] | None:
    """One RTM_NEWNEIGH message's payload as (device index, MAC, remote address), or None
    when the entry has no remote (a bridge's own entries)."""
    index = _NDMSG.unpack_from(data, start)[1]
    attrs = _attrs(data, start + _NDMSG.size, end, _FDB_ATTRS)
    dst = attrs.get(NDA_DST)
    if not dst:
        return None
    family = socket.AF_INET if len(dst) == 4 else socket.AF_INET6
    return index, attrs[NDA_LLADDR].hex(":"), socket.inet_ntop(family, dst)


def _attr_list(data, start: int = 0, end: int | None = None, wanted=None) -> list:
    """Each attribute in ``data[start:end]`` (of the types ``wanted``, when given) as
    (type, payload), in order. One plain loop: a link dump walks ~50 attributes a link."""
    end = len(data) if end is None else end
    found = []
    while start + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, start)
        if length < _ATTR.size:
            raise NetworkDriverError("malformed netlink attribute")
        kind &= NLA_TYPE_MASK
        if wanted is None or kind in wanted:
            found.append((kind, bytes(data[start + _ATTR.size : start + length])))
        start += (length + 3) & ~3
    return found


def _attrs(data, start: int = 0, end: int | None = None, wanted=None) -> dict[int, bytes]:
    """The attributes in ``data[start:end]`` (of the types ``wanted``, when given) by type."""
    return dict(_attr_list(data, start, end, wanted))


def _u32_of(attrs: dict[int, bytes], kind: int) -> int:
    value = attrs.get(kind)
    return _U32.unpack(value)[0] if value else 0


def _text(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode()


def _raise_for_errno(what: str, kind: int, flags: int, data, start: int, end: int) -> None:
    """Raise the error an NLMSG_ERROR or NLMSG_DONE payload carries, if any, as
    NetworkDriverError, with the kernel's own explanation when it gave one."""
    code = -_ERRNO.unpack_from(data, start)[0]
    if not code:
        return
    reason = os.strerror(code)
    if flags & NLM_F_ACK_TLVS:  # after the request's header in an ack (NETLINK_CAP_ACK)
        first = start + _ERRNO.size + (_HEADER.size if kind == NLMSG_ERROR else 0)
        tlvs = _attrs(data, first, end, frozenset({NLMSGERR_ATTR_MSG}))
        if NLMSGERR_ATTR_MSG in tlvs:
            reason = f"{reason} ({_text(tlvs[NLMSGERR_ATTR_MSG])})"
    raise NetworkDriverError(f"{what}: {reason}", errno=code)


# -- encoding -------------------------------------------------------------------------------


def _align(length: int) -> int:
    return (length + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    length = _ATTR.size + len(payload)
    return _ATTR.pack(length, kind) + payload + bytes(_align(length) - length)


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, _U32.pack(value))


def _string(kind: int, value: str) -> bytes:
    return _attr(kind, value.encode() + b"\0")


def _mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def _link_body(index: int = 0, *, up: bool = False, attrs: bytes = b"") -> bytes:
    """An ifinfomsg for device ``index`` (0: a new one), setting IFF_UP when ``up``."""
    flag = IFF_UP if up else 0
    return _IFINFO.pack(socket.AF_UNSPEC, 0, index, flag, flag) + attrs


def _link_info(kind: str, data: bytes = b"") -> bytes:
    info = _string(IFLA_INFO_KIND, kind) + (_attr(IFLA_INFO_DATA, data) if data else b"")
    return _attr(IFLA_LINKINFO, info)


def _fdb_body(index: int, mac: str, dst: str) -> bytes:
    """A static entry of a VXLAN device's own table (``bridge fdb … self``)."""
    ndmsg = _NDMSG.pack(AF_BRIDGE, index, NUD_NOARP | NUD_PERMANENT, NTF_SELF, 0)
    return ndmsg + _attr(NDA_LLADDR, _mac_bytes(mac)) + _attr(NDA_DST, socket.inet_aton(dst))
