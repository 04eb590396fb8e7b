"""Issue 4's acceptance, from the database to the kernel: three network namespaces as hosts
on an underlay (h3 the gateway, with an external bridge to namespace ``ext``), two projects
with networks of the same CIDR spanning h1 and h2, stand-in VMs as namespaces on the
agent's ports. Every object is made through the services; each host converges to
``network.desired.host_networks`` exactly as its agent would; then real packets decide.

Needs root, iproute2, ping and nft; skipped with the reason otherwise. Every namespace
(router namespaces included) is removed at the end, whatever happens.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from compute import services as compute
from network import desired, services
from network.drivers.base import HostNetworks
from network.models import Port
from tests.compute.test_vms import fresh, report
from tests.factories import (
    enroll_network,
    make_host,
    make_image,
    make_network,
    make_pool,
    make_project,
    make_template,
)

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "ping", "nft")),
        reason="needs root, iproute2, ping and nft (network namespaces)",
    ),
    pytest.mark.django_db,
]

TAG = uuid.uuid4().hex[:5]
UNDERLAY = {"h1": "10.97.0.1", "h2": "10.97.0.2", "h3": "10.97.0.3"}
EXT = "198.51.100.1"  # the external network's gateway, and the outside client
SERVER = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen()\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(sys.argv[2].encode()); c.close()\n"
)


def ns(name: str) -> str:
    return f"ka{TAG}-{name}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def in_ns(name: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns(name), *argv, check=check)


def ping(src: str, address: str) -> bool:
    return in_ns(src, "ping", "-c", "1", "-W", "1", address, check=False).returncode == 0


def connect(src: str, address: str, port: int) -> str | None:
    """What a TCP server at address:port says, or None when nothing answers."""
    code = (
        "import socket,sys\n"
        "try:\n"
        f"    c=socket.create_connection(('{address}', {port}), timeout=2)\n"
        "    print(c.recv(64).decode())\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    result = in_ns(src, sys.executable, "-c", code, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def serve(name: str, port: int, word: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns(name), sys.executable, "-c", SERVER, str(port), word],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture
def fabric(tmp_path):
    """Hosts h1-h3 on an underlay bridge in ``sw``; h3's external bridge ``brx`` joined to
    ``ext``; empty namespaces for the stand-in VMs. The drivers keep their resolvers' files
    in the test's own folder."""
    from network.drivers.linux import LinuxNetworkDriver

    names = ["sw", *UNDERLAY, "ext", "a1", "va", "b1", "b2", "vb"]
    drivers = {}
    servers: list[subprocess.Popen] = []
    try:
        for name in names:
            sh("ip", "netns", "add", ns(name))
            in_ns(name, "ip", "link", "set", "lo", "up")
        in_ns("sw", "ip", "link", "add", "ul", "type", "bridge")
        in_ns("sw", "ip", "link", "set", "ul", "up")
        for host, address in UNDERLAY.items():
            sh("ip", "link", "add", f"ka{TAG}{host}", "type", "veth", "peer", "name", "ul0",
               "netns", ns(host))  # fmt: skip
            sh("ip", "link", "set", f"ka{TAG}{host}", "netns", ns("sw"))
            in_ns("sw", "ip", "link", "set", f"ka{TAG}{host}", "master", "ul", "up")
            in_ns(host, "ip", "addr", "add", f"{address}/24", "dev", "ul0")
            in_ns(host, "ip", "link", "set", "ul0", "up")
        in_ns("h3", "ip", "link", "add", "brx", "type", "bridge")
        in_ns("h3", "ip", "link", "set", "brx", "up")
        in_ns("h3", "ip", "link", "add", "xo", "type", "veth", "peer", "name", "eth0",
              "netns", ns("ext"))  # fmt: skip
        in_ns("h3", "ip", "link", "set", "xo", "master", "brx", "up")
        in_ns("ext", "ip", "addr", "add", f"{EXT}/24", "dev", "eth0")
        in_ns("ext", "ip", "link", "set", "eth0", "up")
        drivers = {host: LinuxNetworkDriver(ns(host), dns_dir=tmp_path / host) for host in UNDERLAY}
        yield drivers, servers
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
        for driver in drivers.values():
            try:
                driver.resync(HostNetworks())  # takes router namespaces away too
            finally:
                driver.close()
        for name in names:
            sh("ip", "netns", "del", ns(name), check=False)


@pytest.fixture
def cloud(fabric):
    """The control plane's side: hosts with network agents, a pool, two projects."""
    hosts = {name: make_host(f"{name}-{TAG}") for name in ("h1", "h2")}
    hosts["h3"] = make_host(f"h3-{TAG}", kind="cpu")
    for name, host in hosts.items():
        enroll_network(
            host,
            UNDERLAY[name],
            underlay_device="ul0",
            gateway=name == "h3",
            external_bridge="brx" if name == "h3" else "",
        )
    make_pool(cidr="198.51.100.0/24", gateway_ip=EXT)
    alpha, beta = make_project(slug=f"alpha-{TAG}"), make_project(slug=f"beta-{TAG}")
    net_a = make_network(alpha, "lab", cidr="192.168.10.0/24", external_access=True)
    net_b = make_network(beta, "lab", cidr="192.168.10.0/24")
    return hosts, alpha, beta, net_a, net_b


def converge(fabric, hosts) -> int:
    """Every host converges to what the database wants; returns the writes made."""
    drivers = fabric[0]
    return sum(
        drivers[name].resync(desired.host_networks(host.pk)).writes for name, host in hosts.items()
    )


def stand_in(port: Port, name: str) -> None:
    """Make namespace ``name`` the VM behind ``port``: the port's host side becomes a veth
    pair into it instead of the guest's tap (the one write the test makes by hand)."""
    Port.objects.filter(pk=port.pk).update(binding="veth", binding_netns=ns(name))


def configure(name: str, port: Port) -> None:
    """What cloud-init does in the guest: the port's address and the default route."""
    address = port.fixed_ips.get().address
    in_ns(name, "ip", "addr", "replace", f"{address}/24", "dev", "eth0")
    in_ns(name, "ip", "route", "replace", "default", "via", "192.168.10.1", check=False)


def vm_on(project, network, name, fixed_ip=""):
    vm, _ = compute.vm_create(
        project=project,
        name=name,
        template=make_template(gpus=1),
        image=make_image(),
        nics=[{"network": network, "fixed_ip": fixed_ip}],
    )
    return vm, Port.objects.get(vm=vm)


def test_overlays_isolation_security_groups_dnat_and_address_reuse(fabric, cloud):
    hosts, alpha, beta, net_a, net_b = cloud
    _drivers, servers = fabric
    a1 = services.port_create(
        network=net_a, host=hosts["h1"], binding="veth", binding_netns=ns("a1")
    )
    b1 = services.port_create(
        network=net_b, host=hosts["h1"], binding="veth", binding_netns=ns("b1")
    )
    b2 = services.port_create(
        network=net_b, host=hosts["h2"], binding="veth", binding_netns=ns("b2")
    )
    vm_a, port_va = vm_on(alpha, net_a, "web")
    stand_in(port_va, "va")
    assert converge(fabric, hosts) > 0
    for name, port in (("a1", a1), ("b1", b1), ("b2", b2), ("va", port_va)):
        configure(name, Port.objects.get(pk=port.pk))
    addr_va = port_va.fixed_ips.get().address
    assert addr_va == b2.fixed_ips.get().address == "192.168.10.3"  # overlapping on purpose

    # Within a project, across hosts where the VM landed elsewhere: pings pass.
    assert ping("b1", "192.168.10.3")
    assert ping("a1", addr_va)
    # Across projects nothing passes, even at the same address: a1's .3 is A's VM.
    neigh = in_ns("a1", "ip", "neigh", "show", addr_va).stdout
    assert port_va.mac in neigh and b2.mac not in neigh

    # The project router: SNAT lets A out; B has no router at all.
    assert ping("a1", EXT)
    assert not ping("b1", EXT)

    # One security-group rule opens one TCP port, and only that one, to the outside.
    web = services.security_group_create(project=alpha, name="web")
    services.rule_create(group=web, direction="ingress", protocol="tcp", port_min=8080)
    services.port_update(port=port_va, security_groups=["default", "web"])
    address = services.global_ip_allocate(project=alpha)
    for external, internal in ((80, 8080), (81, 8081)):
        services.port_forward_create(
            address=address,
            protocol="tcp",
            external_port=external,
            port=port_va,
            internal_port=internal,
        )
    converge(fabric, hosts)
    servers.append(serve("va", 8080, "alpha-8080"))
    servers.append(serve("va", 8081, "alpha-8081"))
    time.sleep(0.5)
    assert connect("ext", address.address, 80) == "alpha-8080"  # DNAT, allowed by "web"
    assert connect("ext", address.address, 81) is None  # forwarded, but no rule opens 8081
    assert connect("a1", addr_va, 8081) == "alpha-8081"  # default group: members reach it

    # The VM is deleted; project B's new VM gets exactly the freed address.
    compute.vm_delete(vm=vm_a)
    services.port_delete(port=Port.objects.get(pk=b2.pk))  # B's .3 is free as well
    _vm_b, port_vb = vm_on(beta, net_b, "web", fixed_ip=addr_va)
    stand_in(port_vb, "vb")
    converge(fabric, hosts)
    configure("vb", Port.objects.get(pk=port_vb.pk))
    servers.append(serve("vb", 8080, "beta-8080"))
    time.sleep(0.5)
    in_ns("b1", "ip", "neigh", "flush", "all")  # .3 has moved to a new MAC
    assert ping("b1", addr_va)  # B's own VM answers at the reused address
    # The old rule reaches nothing: not the new owner, not anyone.
    assert connect("ext", address.address, 80) is None

    # Converged: a second pass over every host writes nothing.
    assert converge(fabric, hosts) == 0


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed")
def test_the_underlay_carries_the_networks_vni(fabric, cloud):
    hosts, _alpha, _beta, net_a, _net_b = cloud
    left = services.port_create(network=net_a, host=hosts["h1"], binding="veth",
                                binding_netns=ns("a1"))  # fmt: skip
    right = services.port_create(network=net_a, host=hosts["h2"], binding="veth",
                                 binding_netns=ns("va"))  # fmt: skip
    converge(fabric, hosts)
    configure("a1", left)
    configure("va", right)
    capture = subprocess.Popen(
        ["ip", "netns", "exec", ns("sw"), "tcpdump", "-l", "-n", "-i", "ul", "udp", "port", "4789"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        time.sleep(1)
        assert ping("a1", right.fixed_ips.get().address)
        time.sleep(0.5)
    finally:
        capture.send_signal(signal.SIGINT)
        out, _ = capture.communicate(timeout=10)
    lines = out.splitlines()
    outer = [lines[i - 1] for i, line in enumerate(lines) if i and "ICMP echo request" in line]
    assert outer, out
    assert f"{UNDERLAY['h1']}." in outer[0] and f"{UNDERLAY['h2']}.4789" in outer[0]
    assert f"vni {net_a.vni}" in outer[0]


def test_a_shelved_vm_leaves_its_hosts_network_and_is_reached_where_unshelved(fabric, cloud):
    hosts, _alpha, _beta, net_a, _net_b = cloud
    alpha = net_a.project
    a1 = services.port_create(
        network=net_a, host=hosts["h1"], binding="veth", binding_netns=ns("a1")
    )
    vm, port = vm_on(alpha, net_a, "web")
    stand_in(port, "va")
    report(fresh(vm), "running")
    converge(fabric, hosts)
    configure("a1", Port.objects.get(pk=a1.pk))
    configure("va", Port.objects.get(pk=port.pk))
    address = port.fixed_ips.get().address
    assert ping("a1", address)
    first = fresh(vm).host
    other = next(h for name, h in hosts.items() if name != "h3" and h.pk != first.pk)

    compute.vm_shelve(vm=fresh(vm))
    report(fresh(vm), "absent")
    converge(fabric, hosts)
    # The host it left took its side away: nothing of the VM is left in the fabric.
    assert in_ns("va", "ip", "link", "show", "eth0", check=False).returncode != 0
    for name in UNDERLAY:  # no host sends its MAC to a VTEP any more
        fdb = in_ns(name, "bridge", "fdb", "show").stdout.splitlines()
        assert not [line for line in fdb if port.mac in line and " dst " in line], name
    assert not ping("a1", address)

    compute.host_set_state(host=first, state="maintenance", reason="firmware")
    compute.vm_unshelve(vm=fresh(vm))
    assert fresh(vm).host_id == other.pk
    converge(fabric, hosts)
    configure("va", Port.objects.get(pk=port.pk))
    in_ns("a1", "ip", "neigh", "flush", "all")
    assert ping("a1", address)  # the same address, reached on its new host
    assert converge(fabric, hosts) == 0
