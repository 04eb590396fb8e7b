"""The netlink codec of ``network.drivers.netlink``, checked against pyroute2's own encoder
and decoder (an independent implementation of the same kernel structures): what the kernel
would send is parsed right, and what the driver sends means what it should. The last tests
talk to a real kernel in a throwaway network namespace (root only)."""

import errno
import os
import shutil
import signal
import struct
import subprocess
import time
import uuid

import pytest
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.ndmsg import ndmsg

from network.drivers import netlink
from network.drivers.base import NetworkDriverError
from network.drivers.netlink import (
    NLM_F_CREATE,
    NLM_F_EXCL,
    RTM_NEWLINK,
    Link,
    Netlink,
    Vf,
    parse_fdb_entry,
    parse_link,
)

HEADER = 16  # sizeof(struct nlmsghdr)


def encoded_link(attrs, *, index=7, flags=1) -> bytes:
    msg = ifinfmsg()
    msg["header"]["type"] = RTM_NEWLINK
    msg["index"], msg["flags"], msg["attrs"] = index, flags, attrs
    msg.encode()
    return bytes(msg.data)


def link_info(kind: str, *data):
    return (
        "IFLA_LINKINFO",
        {"attrs": [("IFLA_INFO_KIND", kind), ("IFLA_INFO_DATA", {"attrs": list(data)})]},
    )


def vf_info(vf: int, mac: str, vlan: int, trust: int):
    return (
        "IFLA_VF_INFO",
        {
            "attrs": [
                ("IFLA_VF_MAC", {"vf": vf, "mac": mac}),
                ("IFLA_VF_VLAN", {"vf": vf, "vlan": vlan, "qos": 0}),
                ("IFLA_VF_TRUST", {"vf": vf, "trust": trust}),
            ]
        },
    )


def test_a_physical_function_with_its_vfs_is_parsed():
    data = encoded_link(
        [
            ("IFLA_IFNAME", "enp1s0f0"),
            ("IFLA_MTU", 9000),
            ("IFLA_ADDRESS", "52:54:00:12:34:56"),
            ("IFLA_NUM_VF", 8),
            (
                "IFLA_VFINFO_LIST",
                {
                    "attrs": [
                        vf_info(0, "fa:16:3e:00:00:01", 100, 1),
                        vf_info(1, "00:00:00:00:00:00", 0, 0),
                    ]
                },
            ),
        ]
    )
    assert parse_link(data, HEADER, len(data)) == Link(
        index=7,
        name="enp1s0f0",
        kind="",
        master=0,
        up=True,
        mtu=9000,
        mac="52:54:00:12:34:56",
        num_vfs=8,
        vfs=(
            Vf(index=0, mac="fa:16:3e:00:00:01", vlan=100, trusted=True),
            Vf(index=1, mac="00:00:00:00:00:00", vlan=0, trusted=False),
        ),
    )


def test_a_vxlan_device_and_a_vlan_device_are_parsed_with_their_ids():
    vxlan = encoded_link(
        [
            ("IFLA_IFNAME", "vx-1001"),
            ("IFLA_MASTER", 12),
            link_info("vxlan", ("IFLA_VXLAN_ID", 1001)),
        ],
        flags=0,
    )
    link = parse_link(vxlan, HEADER, len(vxlan))
    assert (link.name, link.kind, link.vni, link.master, link.up) == (
        "vx-1001", "vxlan", 1001, 12, False,
    )  # fmt: skip
    vlan = encoded_link(
        [
            ("IFLA_IFNAME", "vl-1001"),
            ("IFLA_LINK", 3),
            link_info("vlan", ("IFLA_VLAN_ID", 300)),
        ]
    )
    link = parse_link(vlan, HEADER, len(vlan))
    assert (link.kind, link.vlan, link.lower, link.vni, link.num_vfs) == ("vlan", 300, 3, None, 0)


def test_fdb_entries_are_parsed_and_those_without_a_remote_skipped():
    def entry(*attrs) -> bytes:
        msg = ndmsg()
        msg["family"], msg["ifindex"], msg["attrs"] = 7, 42, list(attrs)
        msg.encode()
        return bytes(msg.data)

    remote = entry(("NDA_LLADDR", "fa:16:3e:00:00:02"), ("NDA_DST", "10.99.0.2"))
    assert parse_fdb_entry(remote, HEADER, len(remote)) == (42, "fa:16:3e:00:00:02", "10.99.0.2")
    local = entry(("NDA_LLADDR", "fa:16:3e:00:00:03"))
    assert parse_fdb_entry(local, HEADER, len(local)) is None


@pytest.fixture
def sent(monkeypatch):
    """A Netlink on the host's own namespace whose writes are caught, not sent: yields it
    and a list of the (type, flags, decoded message) it would have sent."""
    nl, messages = Netlink(), []

    def catch(what, kind, flags, body):
        msg = ifinfmsg(struct.pack("=IHHII", HEADER + len(body), kind, flags, 0, 0) + body)
        msg.decode()
        messages.append((kind, flags, msg))

    monkeypatch.setattr(nl, "_send", catch)
    yield nl, messages
    nl.close()


def test_set_vf_sends_ip_link_set_vf_mac_vlan_trust_on(sent):
    nl, messages = sent
    pf = Link(index=4, name="enp1s0f0", kind="", master=0, up=True, mtu=1500, mac="", num_vfs=8)
    nl.set_vf(pf, 3, mac="fa:16:3e:00:00:09", vlan=120)
    [(kind, _, msg)] = messages
    assert kind == RTM_NEWLINK and msg["index"] == 4
    [info] = msg.get("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")
    assert info.get("IFLA_VF_MAC")["vf"] == 3
    assert info.get("IFLA_VF_MAC")["mac"] == "fa:16:3e:00:00:09"
    assert (info.get("IFLA_VF_VLAN")["vf"], info.get("IFLA_VF_VLAN")["vlan"]) == (3, 120)
    assert (info.get("IFLA_VF_TRUST")["vf"], info.get("IFLA_VF_TRUST")["trust"]) == (3, 1)


def test_add_vlan_sends_one_vlan_device_on_the_trunk_up_on_the_bridge(sent):
    nl, messages = sent
    nl._next_index = 50  # as if the last dump's highest index were 49
    assert nl.add_vlan("vl-3001", vlan=300, trunk=2, mtu=1450, master=9) == 50
    [(kind, flags, msg)] = messages
    assert kind == RTM_NEWLINK and flags & NLM_F_CREATE and flags & NLM_F_EXCL
    assert msg["index"] == 50
    assert msg["flags"] & msg["change"] & 1  # IFF_UP
    assert (msg.get("IFLA_IFNAME"), msg.get("IFLA_LINK"), msg.get("IFLA_MASTER")) == (
        "vl-3001", 2, 9,
    )  # fmt: skip
    assert msg.get("IFLA_MTU") == 1450
    info = msg.get("IFLA_LINKINFO")
    assert info.get("IFLA_INFO_KIND") == "vlan"
    assert info.get("IFLA_INFO_DATA").get("IFLA_VLAN_ID") == 300


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2 (network namespaces)",
)


@pytest.fixture
def netns():
    name = f"kn{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        nl = Netlink(name)
        yield nl
        nl.close()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


@needs_root
def test_kernel_errors_become_network_driver_errors_and_every_write_counts(netns):
    index = netns.add_bridge("br-1", 1450)
    assert netns.index("br-1") == index and netns.links()["br-1"].up
    with pytest.raises(NetworkDriverError) as failed:
        netns.add_bridge("br-1", 1450)  # the name is taken
    assert failed.value.errno == errno.EEXIST and "add bridge br-1" in str(failed.value)
    with pytest.raises(NetworkDriverError) as failed:
        netns.index("nothing0")
    assert failed.value.errno == errno.ENODEV
    netns.delete_link(index, "br-1")
    netns.delete_link(index, "br-1")  # already gone: fine
    assert netns.writes == 4
    assert "br-1" not in netns.links()


@needs_root
def test_a_host_without_sr_iov_reports_no_physical_function(netns):
    links = netns.links()
    assert links["lo"].num_vfs == 0 and links["lo"].vfs == ()
    assert netns.sriov_pfs() == {}


@needs_root
def test_a_dump_abandoned_midway_is_not_in_the_way_of_the_next_request(netns, monkeypatch):
    for n in range(200):  # a dump of several parts: the kernel sends at most 32 KiB at once
        netns.add_bridge(f"br-{n}", 1450)

    def broken(data, start, end):
        raise NetworkDriverError("cannot decode")

    monkeypatch.setattr(netlink, "parse_link", broken)
    with pytest.raises(NetworkDriverError, match="cannot decode"):
        netns.links()
    monkeypatch.undo()
    assert len(netns.links()) == 201  # and lo
    assert netns.index("br-199") == netns.links()["br-199"].index


@needs_root
def test_deleting_a_namespace_stops_what_still_runs_inside():
    """A process left inside (a resolver whose folder the agent no longer knows) would keep
    the namespace alive, unnamed and unreachable: deleting the namespace stops it first."""
    name = f"kn{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    inside = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])
    try:
        for _ in range(100):
            if inside.pid in netlink.netns_pids(name):
                break
            time.sleep(0.05)
        assert netlink.netns_pids(name) == [inside.pid]
        nl = Netlink()
        nl.delete_netns(name)
        nl.close()
        assert inside.wait(timeout=10) == -signal.SIGTERM
        assert name not in netlink.netns_names() and netlink.netns_pids(name) == []
    finally:
        inside.kill()
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


@needs_root
def test_a_namespace_is_made_with_its_loopback_up_and_the_caller_stays_where_it_was():
    """``add_netns`` makes the namespace from a thread of its own, not a forked child: the
    calling thread's namespace is the host's before and after, the new one holds only its
    loopback, up, and seen by ``ip`` as any named namespace; a name taken is an error."""
    name = f"kn{uuid.uuid4().hex[:6]}"
    home = os.stat("/proc/thread-self/ns/net").st_ino
    nl = Netlink()
    try:
        nl.add_netns(name)
        assert os.stat("/proc/thread-self/ns/net").st_ino == home
        assert os.stat(f"{netlink.NETNS_DIR}/{name}").st_ino != home
        assert name in netlink.netns_names() and nl.writes == 2  # the namespace, lo up
        inside = Netlink(name)
        links = inside.links()
        inside.close()
        assert list(links) == ["lo"] and links["lo"].up
        shown = subprocess.run(
            ["ip", "netns", "exec", name, "ip", "-o", "link"],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        assert shown.stdout.count("\n") == 1 and "LOOPBACK,UP" in shown.stdout
        with pytest.raises(NetworkDriverError) as failed:
            nl.add_netns(name)
        assert failed.value.errno == errno.EEXIST and f"add netns {name}" in str(failed.value)
        assert os.stat("/proc/thread-self/ns/net").st_ino == home
    finally:
        nl.delete_netns(name)
        nl.close()
    assert name not in netlink.netns_names()
