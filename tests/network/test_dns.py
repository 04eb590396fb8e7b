"""Issue 12's names, from the database to a resolver a client really asks.

One gateway host (namespace ``h``) with an external bridge to ``ext``, where a fake
upstream DNS server (another dnsmasq) answers ``outside.example``. Project A (external
access: a router) and project B (no router) have networks of the same CIDR; each has a
client namespace on a port of its network, whose ``/etc/netns/<ns>/resolv.conf`` is what
the guest's cloud-init writes (the resolver and the search domain Kumo tells the guest),
so glibc's own resolver (``getent``) does the lookups. The host converges exactly as its
agent would. Needs root, iproute2 and dnsmasq; every namespace and process is removed at
the end.
"""

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from django.test import override_settings

from compute import services as compute
from network import desired, dns, selectors, services
from network.drivers import dns as dns_driver
from network.drivers.base import HostNetworks
from network.models import Port
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
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "dnsmasq", "getent")),
        reason="needs root, iproute2, dnsmasq and getent (network namespaces)",
    ),
    pytest.mark.django_db,
]

TAG = uuid.uuid4().hex[:5]
EXT = "198.51.100.1"  # the external network's gateway, and the fake upstream
OUTSIDE = "203.0.113.7"  # what the upstream says outside.example is


def ns(name: str) -> str:
    return f"kd{TAG}-{name}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


def in_ns(name: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns(name), *argv, check=check)


def lookup(client: str, name: str) -> str | None:
    """The address glibc in ``client`` finds for ``name`` (None: not found)."""
    result = in_ns(client, "getent", "ahostsv4", name, check=False)
    return result.stdout.split()[0] if result.returncode == 0 and result.stdout else None


@pytest.fixture
def gateway_host():
    """Namespace ``h`` as the gateway host, with external bridge ``brx`` onto ``ext``
    (where the fake upstream runs); empty client namespaces ``a1`` and ``b1``."""
    from network.drivers.linux import LinuxNetworkDriver

    names = ["h", "ext", "a1", "b1"]
    state = Path(tempfile.mkdtemp(prefix=f"kd{TAG}-"))
    state.chmod(0o755)
    upstream_dir = state / "upstream"
    upstream_dir.mkdir()
    drivers = []
    try:
        for name in names:
            sh("ip", "netns", "add", ns(name))
            in_ns(name, "ip", "link", "set", "lo", "up")
        in_ns("h", "ip", "link", "add", "brx", "type", "bridge")
        in_ns("h", "ip", "link", "set", "brx", "up")
        in_ns("h", "ip", "link", "add", "xo", "type", "veth", "peer", "name", "eth0",
              "netns", ns("ext"))  # fmt: skip
        in_ns("h", "ip", "link", "set", "xo", "master", "brx", "up")
        in_ns("ext", "ip", "addr", "add", f"{EXT}/24", "dev", "eth0")
        in_ns("ext", "ip", "link", "set", "eth0", "up")
        in_ns("ext", "dnsmasq", f"--listen-address={EXT}", "--bind-interfaces", "--no-resolv",
              "--no-hosts", f"--address=/outside.example/{OUTSIDE}", "--user=nobody",
              f"--pid-file={upstream_dir}/pid")  # fmt: skip

        def make_driver():
            driver = LinuxNetworkDriver(ns("h"), dns_dir=state / "dns")
            drivers.append(driver)
            return driver

        yield make_driver, state
    finally:
        for driver in drivers:
            try:
                driver.resync(HostNetworks())  # stops its dnsmasqs, removes their namespaces
            finally:
                driver.close()
        for pid in dns_driver.running(state / "dns").values():  # should be none
            dns_driver.stop(pid)
        pid_file = upstream_dir / "pid"
        if pid_file.exists():
            dns_driver.stop(int(pid_file.read_text()))
        for name in names:
            sh("ip", "netns", "del", ns(name), check=False)
            shutil.rmtree(f"/etc/netns/{ns(name)}", ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def client(name: str, port: Port) -> None:
    """What cloud-init does in a guest on ``port``: its address, default route, and the
    resolver and search domain Kumo gives it (``network.selectors.vm_interfaces``)."""
    ip = port.fixed_ips.select_related("subnet").get()
    servers, search = dns.guest_dns(ip.subnet, port.network, port.project.slug)
    in_ns(name, "ip", "addr", "replace", f"{ip.address}/24", "dev", "eth0")
    in_ns(name, "ip", "route", "replace", "default", "via", ip.subnet.gateway_ip)
    folder = Path(f"/etc/netns/{ns(name)}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "resolv.conf").write_text(
        "".join(f"nameserver {s}\n" for s in servers)
        + (f"search {' '.join(search)}\n" if search else "")
        + "options timeout:1 attempts:1\n"
    )


@override_settings(DNS_UPSTREAM=(EXT,))
def test_each_project_resolves_its_own_names_and_forwards_the_rest(gateway_host):
    make_driver, state = gateway_host
    host = make_host(f"h-{TAG}", kind="cpu")
    enroll_network(host, "10.96.0.1", gateway=True, external_bridge="brx")
    make_pool(cidr="198.51.100.0/24", gateway_ip=EXT)
    alpha, beta = make_project(slug=f"alpha-{TAG}"), make_project(slug=f"beta-{TAG}")
    net_a = make_network(alpha, "lab", cidr="192.168.10.0/24", external_access=True)
    net_b = make_network(beta, "lab", cidr="192.168.10.0/24")
    a1 = services.port_create(network=net_a, host=host, binding="veth", binding_netns=ns("a1"))
    b1 = services.port_create(network=net_b, host=host, binding="veth", binding_netns=ns("b1"))
    web, _ = compute.vm_create(
        project=alpha,
        name="web",
        template=make_template(),
        image=make_image(),
        nics=[{"network": net_a}],
    )
    web_address = Port.objects.get(vm=web).fixed_ips.get().address
    _db, _ = compute.vm_create(
        project=beta, name="db", template=make_template(), image=make_image(),
        nics=[{"network": net_b, "fixed_ip": web_address}],
    )  # fmt: skip

    driver = make_driver()
    state_of_h = desired.host_networks(host.pk)
    assert {(d.vni, bool(d.router_id)) for d in state_of_h.dns} == {
        (net_a.vni, True),  # in A's router
        (net_b.vni, False),  # in B's network's own namespace
    }
    assert driver.resync(state_of_h).writes > 0
    client("a1", Port.objects.get(pk=a1.pk))
    client("b1", Port.objects.get(pk=b1.pk))

    # The guest is told its network's resolver and its project's zone.
    (nic,) = selectors.vm_interfaces(web)
    assert nic.dns == ("192.168.10.1",) and nic.search == (f"alpha-{TAG}.internal",)

    # A's client: the VM by its full name and by its bare name; outside names upstream.
    assert lookup("a1", f"web.alpha-{TAG}.internal") == web_address
    assert lookup("a1", "web") == web_address
    assert lookup("a1", "outside.example") == OUTSIDE
    # B's client, same CIDR, same addresses: only B's names.
    assert lookup("b1", "db") == web_address
    assert lookup("b1", f"web.alpha-{TAG}.internal") is None
    assert lookup("b1", "web") is None
    assert lookup("a1", f"db.beta-{TAG}.internal") is None
    assert lookup("a1", "db") is None

    # Converged: a second resync writes nothing, and a restarted agent (a new driver)
    # adopts the running resolvers without a write.
    assert driver.resync(desired.host_networks(host.pk)).writes == 0
    running = dns_driver.running(state / "dns")
    assert set(running) == {net_a.pk.hex, net_b.pk.hex}
    restarted = make_driver()
    assert restarted.resync(desired.host_networks(host.pk)).writes == 0
    assert dns_driver.running(state / "dns") == running

    # A new VM is answered after one resync (hosts file rewritten, dnsmasq sent SIGHUP,
    # same process); a deleted one is gone.
    api, _ = compute.vm_create(
        project=alpha, name="api", template=make_template(), image=make_image(),
        nics=[{"network": net_a}],
    )  # fmt: skip
    assert restarted.resync(desired.host_networks(host.pk)).writes > 0
    assert lookup("a1", "api") == Port.objects.get(vm=api).fixed_ips.get().address
    compute.vm_delete(vm=web)
    restarted.resync(desired.host_networks(host.pk))
    assert lookup("a1", "web") is None
    assert dns_driver.running(state / "dns") == running

    # B's project gets a router: its resolver moves into it, at the same address.
    services.network_update(network=net_b, external_access=True)
    state_of_h = desired.host_networks(host.pk)
    assert all(d.router_id for d in state_of_h.dns)
    restarted.resync(state_of_h)
    assert not [n for n in sh("ip", "netns", "list").stdout.split() if n == net_b_netns(net_b)]
    assert lookup("b1", "db") == web_address
    assert lookup("b1", "outside.example") == OUTSIDE

    # With nothing desired, every resolver stops and its folder goes.
    restarted.resync(HostNetworks())
    assert dns_driver.running(state / "dns") == {}
    assert not any((state / "dns").iterdir())


def net_b_netns(network) -> str:
    from network.drivers.base import dns_netns

    return dns_netns(network.pk.hex)


def test_the_resolver_keeps_answering_while_the_agent_is_gone(gateway_host):
    """The agent's process is not the resolver's parent: dnsmasq runs in a session of
    its own, so killing the agent (here: the whole process group of a child that ran
    the resync) leaves it answering."""
    make_driver, state = gateway_host
    host = make_host(f"h-{TAG}", kind="cpu")
    enroll_network(host, "10.96.0.1", gateway=True, external_bridge="brx")
    project = make_project(slug=f"gamma-{TAG}")
    net = make_network(project, "lab", cidr="10.20.0.0/24")
    a1 = services.port_create(network=net, host=host, binding="veth", binding_netns=ns("a1"))
    compute.vm_create(
        project=project, name="box", template=make_template(), image=make_image(),
        nics=[{"network": net}],
    )  # fmt: skip
    driver = make_driver()
    wanted = desired.host_networks(host.pk)
    # An "agent" child process converges the host, then its whole group is killed.
    from network import protocol

    code = (
        "import json,sys\n"
        "from network.drivers.linux import LinuxNetworkDriver\n"
        "from network import protocol\n"
        f"d=LinuxNetworkDriver({ns('h')!r}, dns_dir={str(state / 'dns')!r})\n"
        "d.resync(protocol.from_wire(json.loads(sys.stdin.read())))\n"
        "import time; time.sleep(60)\n"
    )
    import json
    import signal
    import sys

    agent = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    agent.stdin.write(json.dumps(protocol.to_wire(wanted)).encode())
    agent.stdin.close()
    deadline = time.monotonic() + 20
    while not dns_driver.running(state / "dns") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait(timeout=10)
    client("a1", Port.objects.get(pk=a1.pk))
    box = Port.objects.get(vm__name="box").fixed_ips.get().address
    assert lookup("a1", "box") == box
    assert driver.resync(wanted).writes == 0  # the next agent adopts it as it is
