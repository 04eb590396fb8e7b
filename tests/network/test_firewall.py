"""Security groups on a real kernel: a host namespace with one overlay network, two stand-in
VMs (namespaces on veth ports) whose ports are filtered, and real TCP, ICMP and a spoofed
source. Needs root and nftables; skipped with the reason otherwise. Every namespace is
removed at the end, whatever happens."""

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from network.drivers.base import FirewallRule, HostNetworks, Network, Port
from network.drivers.linux import LinuxNetworkDriver

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None,
    reason="needs root, iproute2 and nftables (apt-get install nftables)",
)

TAG = uuid.uuid4().hex[:6]
VNI = 2001
V1, V2 = "10.77.0.1", "10.77.0.2"
SERVER = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen()\n"
    "while True:\n"
    "    c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()\n"
)
CLIENT = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1,\n"
    "                             source_address=(sys.argv[3], 0))\n"
    "print(s.recv(100).decode())\n"
)


def ns(name: str) -> str:
    return f"kf{TAG}-{name}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def connect(src: str, address: str, port: int, source: str = "0.0.0.0") -> str | None:
    """What the server at ``address:port`` saw as our address; None when unreachable."""
    done = sh("ip", "netns", "exec", ns(src), sys.executable, "-c", CLIENT, address, str(port),
              source, check=False)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def ping(src: str, address: str) -> bool:
    argv = ("ip", "netns", "exec", ns(src), "ping", "-c", "1", "-W", "1", address)
    return sh(*argv, check=False).returncode == 0


def port(name: str, ip: str, mac: str, *rules: FirewallRule) -> Port:
    return Port(port_id=f"{name}{TAG}", vni=VNI, mac=mac, kind="veth", peer_netns=ns(name),
                ips=(ip,), firewall=rules)  # fmt: skip


V1_RULES = (FirewallRule("egress", "tcp"), FirewallRule("egress", "icmp"))
V2_RULES = (FirewallRule("ingress", "tcp", 8080, 8080),)


def desired(v1_rules=V1_RULES, v2_rules=V2_RULES) -> HostNetworks:
    return HostNetworks(
        networks=(Network(vni=VNI, mtu=1450, local_vtep="10.98.0.1"),),
        ports=(
            port("v1", V1, "fa:16:3e:00:01:01", *v1_rules),
            port("v2", V2, "fa:16:3e:00:01:02", *v2_rules),
        ),
    )


@pytest.fixture(scope="module")
def host():
    names = ["h", "v1", "v2"]
    servers = []
    try:
        for name in names:
            sh("ip", "netns", "add", ns(name))
            sh("ip", "-n", ns(name), "link", "set", "lo", "up")
        driver = LinuxNetworkDriver(ns("h"))
        driver.resync(desired())
        for name, address in (("v1", V1), ("v2", V2)):
            sh("ip", "-n", ns(name), "addr", "add", f"{address}/24", "dev", "eth0")
            for listen in (8080, 8081, 9000):
                servers.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns(name), sys.executable, "-c", SERVER, str(listen)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ))  # fmt: skip
        time.sleep(0.5)  # the servers listen
        yield driver
        driver.close()
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for name in names:
            sh("ip", "netns", "del", ns(name), check=False)


def test_an_ingress_rule_opens_exactly_its_port(host):
    assert connect("v1", V2, 8080) == V1
    assert connect("v1", V2, 8081) is None


def test_icmp_is_refused_until_a_rule_allows_it(host):
    assert not ping("v1", V2)
    opened = desired(v2_rules=(*V2_RULES, FirewallRule("ingress", "icmp")))
    assert host.resync(opened).writes == 1  # one nft transaction
    try:
        assert ping("v1", V2)
    finally:
        host.resync(desired())
    assert not ping("v1", V2)


def test_new_flows_leave_a_port_only_when_an_egress_rule_allows_them(host):
    v1_open = (*V1_RULES, FirewallRule("ingress", "tcp", 9000, 9000))
    host.resync(desired(v1_rules=v1_open))
    try:
        assert connect("v2", V1, 9000) is None  # v2 has no egress rule
        v2_out = (*V2_RULES, FirewallRule("egress", "tcp", 9000, 9000, remote_cidr=f"{V1}/32"))
        host.resync(desired(v1_rules=v1_open, v2_rules=v2_out))
        assert connect("v2", V1, 9000) == V2
    finally:
        host.resync(desired())


def test_a_spoofed_source_address_is_dropped(host):
    sh("ip", "-n", ns("v1"), "addr", "add", "10.77.0.99/24", "dev", "eth0")
    try:
        assert connect("v1", V2, 8080, source="10.77.0.99") is None
        assert connect("v1", V2, 8080, source=V1) == V1
    finally:
        sh("ip", "-n", ns("v1"), "addr", "del", "10.77.0.99/24", "dev", "eth0")


def test_the_tables_hold_the_port_chains_and_a_second_resync_writes_nothing(host):
    assert host.resync(desired()).writes == 0
    ruleset = sh("ip", "netns", "exec", ns("h"), "nft", "list", "ruleset").stdout
    assert "table bridge kumo_filter" in ruleset and "table ip kumo_conntrack" in ruleset
    assert f"chain to-tp-v2{TAG}" in ruleset


def test_ports_without_a_firewall_leave_no_tables(host):
    unfiltered = HostNetworks(
        networks=desired().networks,
        ports=tuple(
            Port(
                port_id=p.port_id,
                vni=p.vni,
                mac=p.mac,
                kind="veth",
                peer_netns=p.peer_netns,
                ips=p.ips,
            )
            for p in desired().ports
        ),
    )
    try:
        assert host.resync(unfiltered).writes == 2  # two tables deleted
        assert "kumo" not in sh("ip", "netns", "exec", ns("h"), "nft", "list", "ruleset").stdout
        assert connect("v1", V2, 8081) == V1
        assert host.resync(unfiltered).writes == 0
    finally:
        host.resync(desired())
