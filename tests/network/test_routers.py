"""Project routers on a real kernel: a gateway host namespace with an external bridge to an
"external" namespace, two projects with the same CIDR each behind its own router, stand-in
VMs as namespaces on overlay ports, and real TCP through SNAT, 1:1 NAT and a DNAT port
forward. Needs root and nftables; skipped with the reason otherwise. Every namespace, the
routers' included, is removed at the end, whatever happens."""

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from network.drivers.base import (
    HostNetworks,
    Network,
    Port,
    PortForward,
    Router,
    RouterInterface,
    router_netns,
)
from network.drivers.linux import LinuxNetworkDriver
from network.drivers.routers import external_leg_name, leg_name

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None,
    reason="needs root, iproute2 and nftables (apt-get install nftables)",
)

TAG = uuid.uuid4().hex[:6]
VNI_A, VNI_B = 3001, 3002
VM_IP = "10.20.0.5"  # in both projects
VMS = (("va", VNI_A, "fa:16:3e:00:03:01"), ("vb", VNI_B, "fa:16:3e:00:03:02"))
EXT_GW, EXT_A, EXT_B = "198.51.100.1", "198.51.100.10", "198.51.100.11"
FORWARD_IP, FLOATING_IP = "198.51.100.20", "198.51.100.30"
SERVER = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen()\n"
    "while True:\n"
    "    c, peer = s.accept(); c.sendall(f'{sys.argv[2]} saw {peer[0]}'.encode()); c.close()\n"
)
CLIENT = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)\n"
    "print(s.recv(100).decode())\n"
)


def ns(name: str) -> str:
    return f"kr{TAG}-{name}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def connect(src: str, address: str, port: int) -> str | None:
    """The server's answer ("<its name> saw <our address>"); None when unreachable."""
    argv = ("ip", "netns", "exec", ns(src), sys.executable, "-c", CLIENT, address, str(port))
    done = sh(*argv, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


FORWARD = PortForward(FORWARD_IP, "tcp", 2222, VM_IP, 22)


def router_a(*, forwards=(FORWARD,)) -> Router:
    return Router(
        router_id=f"a{TAG}",
        interfaces=(RouterInterface(VNI_A, "10.20.0.1/24", "fa:16:3e:00:02:01"),),
        external_address=f"{EXT_A}/24",
        external_gateway=EXT_GW,
        snat_cidrs=("10.20.0.0/24",),
        forwards=forwards,
    )


def router_b() -> Router:
    return Router(
        router_id=f"b{TAG}",
        interfaces=(RouterInterface(VNI_B, "10.20.0.1/24", "fa:16:3e:00:02:02"),),
        external_address=f"{EXT_B}/24",
        external_gateway=EXT_GW,
        snat_cidrs=("10.20.0.0/24",),
        floating=((FLOATING_IP, VM_IP),),
    )


def desired(*routers: Router) -> HostNetworks:
    routers = routers or (router_a(), router_b())
    return HostNetworks(
        networks=tuple(Network(vni=v, mtu=1450, local_vtep="10.98.0.1") for v in (VNI_A, VNI_B)),
        ports=tuple(
            Port(port_id=f"{name}{TAG}", vni=vni, mac=mac, kind="veth", peer_netns=ns(name))
            for name, vni, mac in VMS
        ),
        routers=routers,
        external_bridge="brx",
    )


@pytest.fixture(scope="module")
def gateway():
    """The gateway host ``gw`` with bridge ``brx`` to ``ext`` (the external gateway, with
    a server on 7000); VMs ``va`` and ``vb`` (the same address) serving on 22 and 5000."""
    names = ["gw", "ext", "va", "vb"]
    servers = []
    driver = None
    try:
        for name in names:
            sh("ip", "netns", "add", ns(name))
            sh("ip", "-n", ns(name), "link", "set", "lo", "up")
        sh("ip", "-n", ns("gw"), "link", "add", "brx", "type", "bridge")
        sh("ip", "-n", ns("gw"), "link", "set", "brx", "up")
        sh("ip", "-n", ns("gw"), "link", "add", "toext", "master", "brx", "type", "veth",
           "peer", "name", "eth0", "netns", ns("ext"))  # fmt: skip
        sh("ip", "-n", ns("gw"), "link", "set", "toext", "up")
        sh("ip", "-n", ns("ext"), "addr", "add", f"{EXT_GW}/24", "dev", "eth0")
        sh("ip", "-n", ns("ext"), "link", "set", "eth0", "up")
        driver = LinuxNetworkDriver(ns("gw"))
        driver.resync(desired())
        for vm in ("va", "vb"):
            sh("ip", "-n", ns(vm), "addr", "add", f"{VM_IP}/24", "dev", "eth0")
            sh("ip", "-n", ns(vm), "route", "add", "default", "via", "10.20.0.1")
        for name, listen in (("ext", 7000), ("va", 22), ("vb", 5000)):
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", ns(name), sys.executable, "-c", SERVER, str(listen), name],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        time.sleep(0.5)  # the servers listen
        yield driver
    finally:
        for server in servers:
            server.kill()
            server.wait()
        if driver is not None:
            driver.close()
        for name in [*names, router_netns(f"a{TAG}"), router_netns(f"b{TAG}")]:
            sh("ip", "netns", "del", ns(name) if name in names else name, check=False)


def test_snat_takes_a_vm_out_as_the_routers_external_address(gateway):
    assert connect("va", EXT_GW, 7000) == f"ext saw {EXT_A}"


def test_a_floating_ip_is_the_vms_address_both_ways(gateway):
    assert connect("vb", EXT_GW, 7000) == f"ext saw {FLOATING_IP}"  # not router B's own
    assert connect("ext", FLOATING_IP, 5000) == f"vb saw {EXT_GW}"


def test_a_port_forward_reaches_the_vm_at_the_global_ip(gateway):
    assert connect("ext", FORWARD_IP, 2222) == f"va saw {EXT_GW}"
    assert connect("ext", FORWARD_IP, 5000) is None  # only the forwarded port


def test_projects_with_the_same_cidr_each_meet_their_own_router(gateway):
    for vm, mac in (("va", "fa:16:3e:00:02:01"), ("vb", "fa:16:3e:00:02:02")):
        sh("ip", "netns", "exec", ns(vm), "ping", "-c", "1", "-W", "1", "10.20.0.1")
        assert mac in sh("ip", "-n", ns(vm), "neigh", "show", "10.20.0.1").stdout
    # A's forward leads to va, never to vb, though both are 10.20.0.5.
    assert connect("ext", FORWARD_IP, 2222).startswith("va ")


def test_a_second_resync_writes_nothing(gateway):
    assert gateway.resync(desired()).writes == 0


def test_removing_the_forward_makes_the_vm_unreachable(gateway):
    result = gateway.resync(desired(router_a(forwards=()), router_b()))
    assert result.writes == 2  # the NAT table, the global IP off qg-0
    try:
        assert connect("ext", FORWARD_IP, 2222) is None
        assert connect("va", EXT_GW, 7000) == f"ext saw {EXT_A}"  # SNAT still there
    finally:
        gateway.resync(desired())
    assert connect("ext", FORWARD_IP, 2222) == f"va saw {EXT_GW}"


def test_removing_a_router_takes_its_namespace_and_legs_away(gateway):
    result = gateway.resync(desired(router_a()))
    netns_b = router_netns(f"b{TAG}")
    assert netns_b in result.removed
    assert netns_b not in sh("ip", "netns", "list").stdout
    time.sleep(0.2)  # the namespace's devices go asynchronously
    links = sh("ip", "-n", ns("gw"), "-o", "link").stdout
    assert leg_name(VNI_B) not in links and external_leg_name(f"b{TAG}") not in links
    assert connect("ext", FLOATING_IP, 5000) is None
    assert connect("ext", FORWARD_IP, 2222) == f"va saw {EXT_GW}"
    assert gateway.resync(desired(router_a())).writes == 0
