"""The host network driver on real kernels: three network namespaces as hosts on one
underlay, two projects' overlays with the same CIDR, stand-in VMs as namespaces on the
agent's ports, and real pings. Needs root (network namespaces); skipped with the reason
otherwise. Every namespace is removed at the end, whatever happens."""

import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from network.drivers.base import (
    HostNetworks,
    Network,
    NetworkDriverError,
    Port,
    bridge_name,
    overlay_mtu,
    vxlan_name,
)
from network.drivers.linux import LinuxNetworkDriver

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ping") is None,
    reason="needs root, iproute2 and ping (network namespaces)",
)

TAG = uuid.uuid4().hex[:6]
UNDERLAY = {f"h{i}": f"10.99.0.{i}" for i in (1, 2, 3)}
SUBNET = "192.168.10"  # both projects use it: overlapping CIDRs
VNI_A, VNI_B = 1001, 1002


def ns(name: str) -> str:
    return f"kt{TAG}-{name}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def ping(src: str, address: str) -> bool:
    return (
        sh(
            "ip", "netns", "exec", ns(src), "ping", "-c", "1", "-W", "1", address, check=False
        ).returncode
        == 0
    )


@pytest.fixture(scope="module")
def fabric():
    """Hosts h1-h3 on an underlay bridge in namespace ``sw``; VM namespaces made empty."""
    names = ["sw", *UNDERLAY, "a1", "a2", "b1", "b2", "b3"]
    try:
        for name in names:
            sh("ip", "netns", "add", ns(name))
            sh("ip", "-n", ns(name), "link", "set", "lo", "up")
        sh("ip", "-n", ns("sw"), "link", "add", "ul", "type", "bridge")
        sh("ip", "-n", ns("sw"), "link", "set", "ul", "up")
        for host, address in UNDERLAY.items():
            sh("ip", "link", "add", f"kt{TAG}{host}", "type", "veth", "peer", "name", "ul0",
               "netns", ns(host))  # fmt: skip
            sh("ip", "link", "set", f"kt{TAG}{host}", "netns", ns("sw"))
            sh("ip", "-n", ns("sw"), "link", "set", f"kt{TAG}{host}", "master", "ul", "up")
            sh("ip", "-n", ns(host), "addr", "add", f"{address}/24", "dev", "ul0")
            sh("ip", "-n", ns(host), "link", "set", "ul0", "up")
        drivers = {host: LinuxNetworkDriver(ns(host)) for host in UNDERLAY}
        yield drivers
        for driver in drivers.values():
            driver.close()
    finally:
        for name in names:
            sh("ip", "netns", "del", ns(name), check=False)


def mac(n: int) -> str:
    return f"fa:16:3e:00:00:{n:02x}"


VMS = {  # name: (host, vni, address, mac)
    "a1": ("h1", VNI_A, f"{SUBNET}.11", mac(1)),
    "a2": ("h2", VNI_A, f"{SUBNET}.12", mac(2)),
    "b1": ("h1", VNI_B, f"{SUBNET}.11", mac(3)),  # the same address as a1
    "b2": ("h2", VNI_B, f"{SUBNET}.13", mac(4)),
    "b3": ("h3", VNI_B, f"{SUBNET}.14", mac(5)),
}


def desired(host: str, vms=VMS) -> HostNetworks:
    here = {name: vm for name, vm in vms.items() if vm[0] == host}
    vnis = sorted({vm[1] for vm in here.values()})
    networks = []
    for vni in vnis:
        others = {vm[0] for vm in vms.values() if vm[1] == vni} - {host}
        networks.append(
            Network(
                vni=vni,
                mtu=overlay_mtu(1500),
                local_vtep=UNDERLAY[host],
                remote_vteps=tuple(sorted(UNDERLAY[h] for h in others)),
                remote_macs=tuple(
                    sorted(
                        (vm[3], UNDERLAY[vm[0]])
                        for vm in vms.values()
                        if vm[1] == vni and vm[0] != host
                    )
                ),
            )
        )
    ports = tuple(
        Port(port_id=f"{name}{TAG}", vni=vm[1], mac=vm[3], kind="veth", peer_netns=ns(name))
        for name, vm in here.items()
    )
    return HostNetworks(networks=tuple(networks), ports=ports, underlay_device="ul0")


@pytest.fixture(scope="module")
def converged(fabric):
    results = {host: driver.resync(desired(host)) for host, driver in fabric.items()}
    for name, (_host, _vni, address, _mac) in VMS.items():
        sh("ip", "-n", ns(name), "addr", "add", f"{address}/24", "dev", "eth0")
    return results


def test_devices_are_made_with_the_overlay_mtu_and_learning_off(fabric, converged):
    assert converged["h1"].writes > 0
    details = sh("ip", "-d", "-n", ns("h1"), "link", "show", vxlan_name(VNI_A)).stdout
    assert f"vxlan id {VNI_A}" in details and "nolearning" in details
    assert "dstport 4789" in details and f"local {UNDERLAY['h1']}" in details
    assert "mtu 1450" in details
    bridge = sh("ip", "-n", ns("h1"), "link", "show", "master", bridge_name(VNI_A)).stdout
    assert vxlan_name(VNI_A) in bridge and f"tp-a1{TAG}" in bridge
    fdb = sh("bridge", "-n", ns("h1"), "fdb", "show", "dev", vxlan_name(VNI_A)).stdout
    assert f"00:00:00:00:00:00 dst {UNDERLAY['h2']}" in fdb
    assert f"{mac(2)} dst {UNDERLAY['h2']}" in fdb


def test_a_project_reaches_its_own_vms_across_hosts(converged):
    assert ping("a1", f"{SUBNET}.12")
    assert ping("b1", f"{SUBNET}.13")
    assert ping("b2", f"{SUBNET}.14")  # a third host, over head-end replication


def test_projects_are_isolated_even_with_overlapping_addresses(converged):
    assert not ping("a2", f"{SUBNET}.13")  # b2's address: another project's
    assert not ping("b2", f"{SUBNET}.12")  # a2's
    # .11 is a1 in project A and b1 in project B: each reaches its own, by its MAC.
    for src, expected in (("a2", mac(1)), ("b2", mac(3))):
        assert ping(src, f"{SUBNET}.11")
        neigh = sh("ip", "-n", ns(src), "neigh", "show", f"{SUBNET}.11").stdout
        assert expected in neigh


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed")
def test_the_underlay_carries_udp_4789_with_the_network_vni(converged):
    capture = subprocess.Popen(
        ["ip", "netns", "exec", ns("sw"), "tcpdump", "-l", "-n", "-i", "ul", "udp", "port", "4789"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        time.sleep(1)  # tcpdump attaches
        assert ping("a1", f"{SUBNET}.12")
        time.sleep(0.5)
    finally:
        capture.send_signal(signal.SIGINT)
        out, _ = capture.communicate(timeout=10)
    # tcpdump prints the outer packet, then the frame it carries on the next line.
    lines = out.splitlines()
    outer = [lines[i - 1] for i, line in enumerate(lines) if i and "ICMP echo request" in line]
    assert outer, out
    # From h1's VTEP to h2's on UDP 4789, tagged with project A's VNI.
    assert f"{UNDERLAY['h1']}." in outer[0] and f"{UNDERLAY['h2']}.4789" in outer[0]
    assert f"VXLAN, flags [I] (0x08), vni {VNI_A}" in outer[0]


def test_a_second_resync_writes_nothing(fabric, converged):
    for host, driver in fabric.items():
        assert driver.resync(desired(host)).writes == 0


def test_removing_a_vm_and_a_network_takes_their_devices_away(fabric, converged):
    without_b3 = {name: vm for name, vm in VMS.items() if name != "b3"}
    result = fabric["h3"].resync(desired("h3", without_b3))
    assert set(result.removed) == {f"tp-b3{TAG}"[:15], vxlan_name(VNI_B), bridge_name(VNI_B)}
    assert "tp-" not in sh("ip", "-n", ns("h3"), "-o", "link").stdout
    assert fabric["h3"].resync(desired("h3", without_b3)).writes == 0
    # Back again: the same names, converged from scratch.
    fabric["h3"].resync(desired("h3"))
    sh("ip", "-n", ns("b3"), "addr", "replace", f"{SUBNET}.14/24", "dev", "eth0")
    assert ping("b2", f"{SUBNET}.14")


def test_a_device_changed_behind_the_agents_back_is_put_right(fabric, converged):
    sh("ip", "-n", ns("h1"), "link", "set", vxlan_name(VNI_A), "nomaster")
    sh(
        "bridge",
        "-n",
        ns("h1"),
        "fdb",
        "del",
        mac(2),
        "dev",
        vxlan_name(VNI_A),
        "dst",
        UNDERLAY["h2"],
    )
    result = fabric["h1"].resync(desired("h1"))
    assert result.writes == 2  # enslave again, put the FDB entry back
    assert ping("a1", f"{SUBNET}.12")


def test_an_index_taken_behind_the_agents_back_falls_back_to_the_kernels_choice(fabric, converged):
    driver = fabric["h3"]
    links = driver.nl.links()  # the driver now plans to give the next device max + 1
    planned = max(link.index for link in links.values()) + 1
    sh("ip", "-n", ns("h3"), "link", "add", "other0", "index", str(planned), "type", "bridge")
    try:
        extra = Network(vni=4242, mtu=1450, local_vtep=UNDERLAY["h3"])
        state = desired("h3")
        result = driver.resync(
            HostNetworks(
                networks=(*state.networks, extra), ports=state.ports, underlay_device="ul0"
            )
        )
        assert {bridge_name(4242), vxlan_name(4242)} <= set(result.created)
        details = sh("ip", "-d", "-n", ns("h3"), "link", "show", vxlan_name(4242)).stdout
        assert f"master {bridge_name(4242)}" in details and "vxlan id 4242" in details
        assert driver.resync(desired("h3")).removed == [vxlan_name(4242), bridge_name(4242)]
    finally:
        sh("ip", "-n", ns("h3"), "link", "del", "other0")


def with_port(state: HostNetworks, port: Port) -> HostNetworks:
    return HostNetworks(networks=state.networks, ports=(*state.ports, port), underlay_device="ul0")


def test_a_tap_port_for_a_vm_joins_its_bridge_and_converges_once(fabric, converged):
    state = desired("h3")
    tap = Port(port_id=f"vm{TAG}", vni=VNI_B, mac=mac(9), kind="tap")
    with_tap = with_port(state, tap)
    assert tap.name in fabric["h3"].resync(with_tap).created
    details = sh("ip", "-d", "-n", ns("h3"), "link", "show", tap.name).stdout
    assert "tun type tap" in details and f"master {bridge_name(VNI_B)}" in details
    assert "mtu 1450" in details
    assert fabric["h3"].resync(with_tap).writes == 0
    assert fabric["h3"].resync(state).removed == [tap.name]


HOLD_TAP = (
    "import fcntl, os, struct, sys, time\n"
    "fd = os.open('/dev/net/tun', os.O_RDWR)\n"
    "fcntl.ioctl(fd, 0x400454CA, struct.pack('16sH', sys.argv[1].encode(), 0x0002 | 0x1000))\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)  # TUNSETIFF with IFF_TAP | IFF_NO_PI: what QEMU does with a guest's tap


def test_a_tap_a_guest_holds_outlives_a_state_without_it_and_goes_once_let_go(fabric, converged):
    # A VM placed here again while the host still applies the state of its leaving: its
    # new QEMU holds the tap before the state that names it again arrives.
    state = desired("h3")
    tap = Port(port_id=f"held{TAG}", vni=VNI_B, mac=mac(10), kind="tap")
    with_tap = with_port(state, tap)
    assert tap.name in fabric["h3"].resync(with_tap).created
    qemu = subprocess.Popen(
        ["ip", "netns", "exec", ns("h3"), sys.executable, "-c", HOLD_TAP, tap.name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert qemu.stdout.readline().strip() == "held"
        assert fabric["h3"].resync(state).removed == []  # left to the guest holding it
        assert "NO-CARRIER" not in sh("ip", "-n", ns("h3"), "link", "show", tap.name).stdout
        assert fabric["h3"].resync(with_tap).created == []  # the same tap, bridged again
    finally:
        qemu.kill()
        qemu.wait()
    assert fabric["h3"].resync(state).removed == [tap.name]


def test_the_host_reports_no_sr_iov_physical_function(fabric):
    assert fabric["h1"].capabilities() == {"sriov_pfs": {}}


@pytest.mark.parametrize(
    ("pf", "reason"),
    [("nope0", "physical function nope0 is missing"), ("ul0", "ul0 has 0 VFs, so no VF 2")],
)
def test_a_vf_port_without_its_vf_fails_before_any_write(fabric, converged, pf, reason):
    driver, state = fabric["h1"], desired("h1")
    vf = Port(port_id=f"vf{TAG}", vni=VNI_A, mac=mac(10), kind="vf", pf=pf, vf_index=2, vlan=7)
    before = driver.nl.writes
    with pytest.raises(NetworkDriverError, match=reason):
        driver.resync(
            HostNetworks(networks=state.networks, ports=(*state.ports, vf), underlay_device="ul0")
        )
    assert driver.nl.writes == before


# -- L2VPN: a network's VLAN on the trunk to an outside network (a supercomputer) -----------

L2VPN_VNI, L2VPN_VLAN = 3001, 300
OUTSIDE = "192.168.30"  # the supercomputer's subnet, which the network shares


@functools.cache
def kernel_has_vlans() -> bool:
    """Whether this kernel makes 802.1Q VLAN devices (CONFIG_VLAN_8021Q), tried in a
    throwaway namespace."""
    name = ns("vlanprobe")
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "add", "name", "t0", "type", "veth", "peer", "name", "t1")
        made = sh("ip", "-n", name, "link", "add", "link", "t0", "name", "t0.5", "type", "vlan",
                  "id", "5", check=False)  # fmt: skip
        return made.returncode == 0
    finally:
        sh("ip", "netns", "del", name, check=False)


def l2vpn_state(vlan: int = L2VPN_VLAN, *, with_vm: bool = True) -> HostNetworks:
    net = Network(vni=L2VPN_VNI, mtu=overlay_mtu(1500), local_vtep="10.97.0.1", l2vpn_vlan=vlan)
    vm = Port(port_id=f"l2{TAG}", vni=L2VPN_VNI, mac=mac(20), kind="veth", peer_netns=ns("vm"))
    return HostNetworks(networks=(net,), ports=(vm,) if with_vm else (), trunk_device="trunk0")


@pytest.fixture
def l2vpn():
    """The gateway host ``gw``, whose trunk ``trunk0`` is a veth to the supercomputer
    ``sc``; there, VLAN L2VPN_VLAN of the trunk holds .1 of the shared subnet; ``vm`` is the
    stand-in VM. Yields the gateway's driver."""
    if not kernel_has_vlans():
        pytest.skip("this kernel makes no 802.1Q VLAN devices (CONFIG_VLAN_8021Q is off)")
    names = ["gw", "sc", "vm"]
    try:
        for name in names:
            sh("ip", "netns", "add", ns(name))
        sh("ip", "-n", ns("gw"), "link", "add", "name", "trunk0", "type", "veth", "peer", "name",
           "eth1", "netns", ns("sc"))  # fmt: skip
        sh("ip", "-n", ns("gw"), "link", "set", "trunk0", "up")
        sh("ip", "-n", ns("sc"), "link", "set", "eth1", "up")
        sh("ip", "-n", ns("sc"), "link", "add", "link", "eth1", "name", "eth1.vpn", "type", "vlan",
           "id", str(L2VPN_VLAN))  # fmt: skip
        sh("ip", "-n", ns("sc"), "addr", "add", f"{OUTSIDE}.1/24", "dev", "eth1.vpn")
        sh("ip", "-n", ns("sc"), "link", "set", "eth1.vpn", "up")
        driver = LinuxNetworkDriver(ns("gw"))
        try:
            yield driver
        finally:
            driver.close()
    finally:
        for name in names:
            sh("ip", "netns", "del", ns(name), check=False)


def test_an_l2vpn_vlan_carries_the_network_to_the_supercomputer(l2vpn):
    assert f"vl-{L2VPN_VNI}" in l2vpn.resync(l2vpn_state()).created
    details = sh("ip", "-d", "-n", ns("gw"), "link", "show", f"vl-{L2VPN_VNI}").stdout
    assert f"vl-{L2VPN_VNI}@trunk0" in details and f"802.1Q id {L2VPN_VLAN}" in details
    assert f"master {bridge_name(L2VPN_VNI)}" in details and "mtu 1450" in details
    assert ",UP" in details
    sh("ip", "-n", ns("vm"), "addr", "add", f"{OUTSIDE}.11/24", "dev", "eth0")
    assert ping("vm", f"{OUTSIDE}.1")  # across the bridge, the VLAN and the trunk
    assert l2vpn.resync(l2vpn_state()).writes == 0


def test_an_l2vpn_vlan_of_another_id_is_replaced_and_an_unwanted_one_removed(l2vpn):
    name = f"vl-{L2VPN_VNI}"
    l2vpn.resync(l2vpn_state(L2VPN_VLAN + 1))
    result = l2vpn.resync(l2vpn_state())
    assert (result.removed, result.created) == ([name], [name])
    assert f"802.1Q id {L2VPN_VLAN} " in sh("ip", "-d", "-n", ns("gw"), "link", "show", name).stdout
    assert l2vpn.resync(l2vpn_state(0)).removed == [name]
    assert l2vpn.resync(l2vpn_state(0)).writes == 0


def test_on_a_kernel_without_vlans_an_l2vpn_fails_with_the_kernels_reason():
    if kernel_has_vlans():
        pytest.skip("this kernel makes 802.1Q VLAN devices")
    name = ns("novlan")
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "add", "name", "trunk0", "type", "veth", "peer", "name", "t1")
        driver = LinuxNetworkDriver(name)
        try:
            with pytest.raises(NetworkDriverError, match="add vlan vl-3001 id 300") as failed:
                driver.resync(l2vpn_state(with_vm=False))
            assert failed.value.errno == errno.EOPNOTSUPP, failed.value
            assert "Unknown device type" in str(failed.value)  # the kernel's own words
        finally:
            driver.close()
    finally:
        sh("ip", "netns", "del", name, check=False)
