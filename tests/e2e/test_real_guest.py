"""The real-guest test (issue 12): a Debian guest booted through Kumo's real processes and
reached over SSH.

The topology is the real one: the API (gunicorn), the controller, beat and two host agents
over the embedded broker. Host ``real-01``'s agent drives ``qemu:///system`` (KVM where it
boots, else QEMU's TCG: ``compute.drivers.accel``); host ``gpu-01`` is a simulated GPU node on
libvirt's test driver and the project's gateway. Each agent converges its own namespace of
a simulated fabric (``network.simfabric``): the real guest's tap is handed into
``real-01``'s namespace once QEMU holds it, so the guest sits on its project's VXLAN overlay.

One guest is booted (Kumo's own image, ``make image-file``; 1 vCPU, 1 GiB) and every check
runs against it, in the order a user would meet them: it reaches running through the API,
``ssh -i <the user's key>`` from the simulated outside logs in through the project's global
IP and a port forward, the guest holds what cloud-init took from Kumo's seed (hostname,
static address, gateway and MTU, ``/etc/kumo/metadata.env`` root-only, password login off),
a stand-in VM on the other host reaches it across the overlay and another project's with
the same CIDR does not.

Steps that need parts other helpers are building are marked ``PENDING(<part>)`` below:
they are completed when those parts are on main.

Needs root, QEMU, libvirtd (``make kvm-host``) and the image (``make image-file``); skipped
with the reason otherwise. Everything it makes (namespaces, domains, taps, files) carries a
per-run name and is removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from compute.choices import HostState
from compute.drivers import domain_xml
from compute.imagebuild import cached_image
from compute.management.commands.simfleet import write_and_register
from compute.models import Host
from network import simfabric
from network.drivers.base import HostNetworks
from network.drivers.linux import LinuxNetworkDriver
from network.models import HostNetwork, Port
from network.services import port_create
from tenants import services as tenants
from tests.e2e.processes import Fleet, database_url, free_port, start_topology, wait_for
from tests.factories import UserFactory, make_network, make_pool, make_project, token_for

REAL, SIM = "real-01", "gpu-01"  # gpu-01: a simulated GPU node, where CPU VMs never go
CIDR = "10.42.0.0/24"
BOOT_TIMEOUT_S = float(os.environ.get("KUMO_TEST_BOOT_TIMEOUT_S", "600"))
# Where guests reach the metadata endpoint: a relay in the simulated outside (the guest gets
# there through its project's router) to the API on this machine's loopback.
METADATA_PORT = 8775
METADATA_URL = f"http://{simfabric.EXTERNAL_GATEWAY}:{METADATA_PORT}/api/v1/metadata"


def _skip_reason() -> str | None:
    if os.geteuid() != 0 or not simfabric.available():
        return "needs root and iproute2 (network namespaces, qemu:///system)"
    if not shutil.which("qemu-system-x86_64") or not shutil.which("ssh"):
        return "QEMU (qemu-system-x86) or the ssh client is not installed: `make kvm-host`"
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        libvirt.open("qemu:///system").close()
    except libvirt.libvirtError as e:
        return f"libvirtd does not answer on qemu:///system ({e}): `make kvm-host`"
    if cached_image() is None:
        return "Kumo's guest image is not built: `make image-file`"
    return None


pytestmark = [
    pytest.mark.real_guest,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(BOOT_TIMEOUT_S + 600),
    pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or ""),
]


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)


class Guest:
    """How the test reaches one guest: SSH from a namespace, with the user's key."""

    def __init__(self, key: Path, netns: str, address: str, port: int = 22):
        self.key, self.netns, self.address, self.port = key, netns, address, port

    def ssh_argv(self, command: str, *extra: str) -> list[str]:
        return [
            "ip", "netns", "exec", self.netns, "ssh", "-i", str(self.key), "-p", str(self.port),
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "ConnectTimeout=30", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            *extra, f"debian@{self.address}", command,
        ]  # fmt: skip

    def run(self, command: str, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        """``command`` in the guest; a connection that fails (ssh's 255: sshd restarting
        while cloud-init finishes, a slow TCG guest) is tried again, four times."""
        for _ in range(5):
            done = sh(*self.ssh_argv(command, *extra), check=False, timeout=180)
            if done.returncode != 255:
                break
            time.sleep(5)
        if check and done.returncode != 0:
            raise AssertionError(f"{command!r} in the guest: {done.returncode} {done.stderr}")
        return done

    def wait(self, timeout: float) -> float:
        """Seconds until SSH logs in and runs a command."""
        start = time.monotonic()
        last = None
        while time.monotonic() - start < timeout:
            last = sh(*self.ssh_argv("true", "-o", "ConnectTimeout=5"), check=False, timeout=60)
            if last.returncode == 0:
                return time.monotonic() - start
            time.sleep(2)
        raise AssertionError(f"no SSH login within {timeout:.0f} s: {last and last.stderr}")


@contextlib.contextmanager
def relay(netns: str, address: str, port: int, target_port: int):
    """Relay TCP from ``address:port`` inside namespace ``netns`` to ``127.0.0.1:target_port``
    here, for as long as the block runs."""
    from network.drivers.netlink import netns_entered

    with netns_entered(netns):
        server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(16)
    server.settimeout(0.5)
    stop = threading.Event()

    def pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def serve():
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", target_port), timeout=10)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        server.close()
        thread.join(timeout=5)


@pytest.fixture
def fabric():
    prefix = f"kg{uuid.uuid4().hex[:4]}"
    sims = simfabric.ensure([SIM, REAL], gateway=SIM, prefix=prefix)
    standins = [f"{prefix}-si-{name}" for name in ("alpha", "beta")]
    for namespace in standins:
        sh("ip", "netns", "add", namespace)
        sh("ip", "-n", namespace, "link", "set", "lo", "up")
    yield prefix, {h.name: h for h in sims}, standins
    for host in sims:  # what the agents built (router namespaces included) goes first
        driver = LinuxNetworkDriver(host.netns)
        try:
            driver.resync(HostNetworks())
        finally:
            driver.close()
    for namespace in standins:
        sh("ip", "netns", "del", namespace, check=False)
    simfabric.remove([SIM, REAL], prefix=prefix)


@pytest.fixture
def cloud(fabric, tmp_path):
    """The running topology with a real host and a simulated one, a project with a network
    that reaches outside, the user's SSH key registered, Kumo's image and a small CPU
    template."""
    prefix, sims, standins = fabric
    instances = Path(tempfile.mkdtemp(prefix="kumo-guest-", dir="/tmp"))
    instances.chmod(0o755)  # QEMU runs as libvirt-qemu: it must reach the overlay and seed
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL="filesystem://",
        KUMO_VAR_DIR=str(tmp_path),
        KUMO_INSTANCES_DIR=str(instances),
        KUMO_HEARTBEAT_INTERVAL_S="1",
        KUMO_GUESTS_REPORT_INTERVAL_S="2",
        KUMO_RECONCILE_GRACE_S="5",
        KUMO_NETWORK_REPORT_INTERVAL_S="2",
        KUMO_NETWORK_SYNC_S="2",
        KUMO_METADATA_URL=METADATA_URL,
        # The guest asks for the metadata endpoint by the relay's address (Host header).
        ALLOWED_HOSTS=f"localhost,127.0.0.1,{simfabric.EXTERNAL_GATEWAY}",
        DATABASE_TEST_NAME="",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    fleet = Fleet(env, tmp_path)
    vm_ids: list[str] = []
    stack = contextlib.ExitStack()
    try:
        uris = write_and_register(tmp_path / "fleet", [SIM])
        uris[REAL] = "qemu:///system"
        make_pool(cidr=simfabric.EXTERNAL_CIDR, gateway_ip=simfabric.EXTERNAL_GATEWAY)
        port = free_port()
        outside = simfabric.netns(simfabric.EXTERNAL, prefix)
        stack.enter_context(relay(outside, simfabric.EXTERNAL_GATEWAY, METADATA_PORT, port))
        start_topology(
            fleet,
            bind=f"127.0.0.1:{port}",
            hosts=[SIM, REAL],
            uris=uris,
            agent_args={name: sim.agent_args() for name, sim in sims.items()},
        )
        owner = UserFactory()
        project = make_project(owner=owner, slug=f"guest-{prefix}")
        tenants.quota_set(project=project, vcpus=64, memory_gib=256, gpus=0, vms=8)
        make_network(project, "lab", cidr=CIDR, external_access=True)

        def ready():
            up = Host.objects.filter(name__in=[SIM, REAL], state=HostState.UP).count() == 2
            nets = HostNetwork.objects.filter(host__name__in=[SIM, REAL])
            return up and nets.filter(vtep_address__isnull=False).count() == 2

        wait_for(ready, timeout=120, what="both agents up with their network side", fleet=fleet)
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=30,
            headers={"Authorization": f"Bearer {token_for(owner)}"},
        )
        key = tmp_path / "id_ed25519"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "researcher", "-f", str(key))
        r = api.post(
            "/api/v1/user/ssh-keys/",
            json={"name": "laptop", "public_key": key.with_suffix(".pub").read_text()},
        )
        assert r.status_code == 201, r.text
        from compute.services.guest_image import guest_image_register
        from tests.factories import make_template

        image, _ = guest_image_register(built=cached_image())
        template = make_template(vcpus=1, memory_gib=1, disk_gib=4, name=f"c1-{prefix}")
        yield {
            "fleet": fleet,
            "api": api,
            "base": f"/api/v1/projects/{project.slug}",
            "project": project,
            "key": key,
            "image": image.pk,
            "template": template.name,
            "prefix": prefix,
            "sims": sims,
            "standins": standins,
            "staff": httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                timeout=30,
                headers={"Authorization": f"Bearer {token_for(UserFactory(is_staff=True))}"},
            ),
            "vm_ids": vm_ids,
        }
    finally:
        fleet.stop()
        stack.close()
        _remove_guests(vm_ids)
        shutil.rmtree(instances, ignore_errors=True)


ASK_METADATA = """import urllib.error, urllib.request
env = dict(l.strip().split("=", 1) for l in open("/etc/kumo/metadata.env") if "=" in l)
req = urllib.request.Request(env["KUMO_METADATA_URL"] + "/spot/instance-action",
                             headers={"X-Kumo-Metadata-Token": env["KUMO_METADATA_TOKEN"]})
try:
    print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def _remove_guests(vm_ids: list[str]) -> None:
    """Whatever the run left on libvirtd: its domains, and the taps they held."""
    import libvirt

    conn = libvirt.open("qemu:///system")
    try:
        for vm_id in vm_ids:
            with contextlib.suppress(libvirt.libvirtError):
                dom = conn.lookupByName(domain_xml.domain_name(vm_id))
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
                dom.undefineFlags(0)
    finally:
        conn.close()
    for port in Port.objects.filter(vm_id__in=vm_ids):
        from network.drivers.base import port_name

        sh("ip", "link", "del", port_name(str(port.pk).replace("-", "")), check=False)


def _stand_in(project, network_name: str, host: Host, namespace: str, fixed_ip: str = "") -> str:
    """Make ``namespace`` a VM of ``project`` on ``host`` (a veth port into it, as the
    network tests' stand-ins) with its address (``fixed_ip``, or the next free one) and
    default route; returns the address."""
    from network.models import Network

    network = Network.objects.get(project=project, name=network_name)
    port = port_create(
        network=network, host=host, binding="veth", binding_netns=namespace, fixed_ip=fixed_ip
    )
    address = port.fixed_ips.get().address
    gateway = network.subnets.get().gateway_ip

    def configured():
        links = sh("ip", "-n", namespace, "-o", "link").stdout
        return "eth0" in links

    wait_for(configured, timeout=60, what=f"stand-in {namespace}'s veth")
    sh("ip", "-n", namespace, "addr", "replace", f"{address}/24", "dev", "eth0")
    sh("ip", "-n", namespace, "link", "set", "eth0", "up")
    sh("ip", "-n", namespace, "route", "replace", "default", "via", str(gateway), check=False)
    return address


def test_a_real_guest_boots_through_the_api_and_is_reached_over_ssh(cloud):
    api, base, fleet = cloud["api"], cloud["base"], cloud["fleet"]
    prefix = cloud["prefix"]

    # The real host says how its guests run.
    hosts = {h["name"]: h for h in cloud["staff"].get("/api/v1/admin/hosts/").json()["results"]}
    assert hosts[REAL]["guest_accel"] in ("kvm", "tcg")
    assert hosts[SIM]["guest_accel"] == ""

    # API create; the scheduler puts a CPU VM on the host without GPUs: the real one.
    started = time.monotonic()
    r = api.post(
        f"{base}/vms/",
        json={
            "name": "lab-vm",
            "template": cloud["template"],
            "image": cloud["image"],
            "ssh_keys": ["laptop"],
            "nics": [{"network": "lab"}],
        },
    )
    assert r.status_code == 202, r.text
    vm = r.json()
    cloud["vm_ids"].append(vm["id"])
    vm = wait_for(
        lambda: (
            (v := api.get(f"{base}/vms/{vm['id']}/").json())["state"] in ("running", "error") and v
        ),
        timeout=180,
        what="the VM defined and started",
        fleet=fleet,
    )
    assert vm["state"] == "running", vm
    assert vm["host"] == REAL
    ports = api.get(f"{base}/ports/").json()["results"]
    port = next(p for p in ports if p.get("vm") == vm["id"])
    address = port["fixed_ips"][0]
    network = next(n for n in api.get(f"{base}/networks/").json()["results"] if n["name"] == "lab")

    # SSH in from anywhere (the default group lets in only the project's own VMs), the
    # project's global IP and a port forward to the guest's SSH.
    rule = {"group": "default", "direction": "ingress", "protocol": "tcp", "port_min": 22,
            "port_max": 22, "remote_cidr": "0.0.0.0/0"}  # fmt: skip
    r = api.post(f"{base}/security-group-rules/", json=rule)
    assert r.status_code == 201, r.text
    gip = api.post(f"{base}/global-ips/", json={}).json()["address"]
    r = api.post(
        f"{base}/port-forwards/",
        json={"global_ip": gip, "protocol": "tcp", "external_port": 2222, "port": port["id"],
              "internal_port": 22},
    )  # fmt: skip
    assert r.status_code == 201, r.text

    # ssh -i <the user's key> from the simulated outside, through the global IP.
    outside = Guest(cloud["key"], simfabric.netns(simfabric.EXTERNAL, prefix), gip, 2222)
    boot_s = outside.wait(BOOT_TIMEOUT_S)
    total_s = time.monotonic() - started
    print(f"real guest: API POST to SSH login {total_s:.1f} s ({hosts[REAL]['guest_accel']})")
    outside.run("cloud-init status --wait >/dev/null; true")  # first boot's stages done

    # What cloud-init took from Kumo's seed.
    assert outside.run("hostname").stdout.strip() == "lab-vm"
    addr = outside.run("ip -4 -o addr show dev ens-0").stdout
    assert f"{address}/24" in addr, addr
    route = outside.run("ip -4 route show default").stdout
    assert "via 10.42.0.1" in route, route
    assert outside.run("cat /sys/class/net/ens-0/mtu").stdout.strip() == str(network["mtu"])
    meta = outside.run("sudo stat -c '%a %U %G' /etc/kumo/metadata.env").stdout.split()
    assert meta == ["600", "root", "root"], meta
    assert "KUMO_METADATA_TOKEN=" in outside.run("sudo cat /etc/kumo/metadata.env").stdout
    assert outside.run("cat /etc/kumo/metadata.env", check=False).returncode != 0
    # Password login over SSH is off: the server offers public keys only.
    refused = sh(
        *outside.ssh_argv(
            "true", "-o", "PreferredAuthentications=password,keyboard-interactive",
            "-o", "PubkeyAuthentication=no",
        ),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "publickey" in refused.stderr, refused.stderr
    assert "PasswordAuthentication no" in outside.run("sudo sshd -T").stdout.replace(
        "passwordauthentication no", "PasswordAuthentication no"
    )

    # Kumo's spot watcher runs, and the guest reaches the metadata endpoint with its token
    # (nothing is scheduled for it: 404).
    assert outside.run("systemctl is-active kumo-spot-watch").stdout.strip() == "active"
    probe = outside.run(f"sudo python3 - <<'EOF'\n{ASK_METADATA}EOF").stdout.strip()
    assert probe == "404", probe

    # Across the overlay: a stand-in VM of the project on the other host reaches the guest
    # by address, and the guest reaches it; another project's, same CIDR, does not.
    alpha_ns, beta_ns = cloud["standins"]
    sim_host = Host.objects.get(name=SIM)
    alpha = _stand_in(cloud["project"], "lab", sim_host, alpha_ns)
    wait_for(
        lambda: sh("ip", "netns", "exec", alpha_ns, "ping", "-c1", "-W1", address,
                   check=False).returncode == 0,
        timeout=60, what="the stand-in reaching the guest over VXLAN", fleet=fleet,
    )  # fmt: skip
    assert outside.run(f"ping -c1 -W2 {alpha}").returncode == 0
    other = make_project(slug=f"other-{prefix}")
    make_network(other, "lab", cidr=CIDR)
    # Another address than the guest's (the first of the same CIDR would be the guest's own,
    # and a ping of it would answer itself).
    _stand_in(other, "lab", sim_host, beta_ns, fixed_ip="10.42.0.77")
    time.sleep(3)  # its port converged; then nothing of the guest answers
    assert (
        sh("ip", "netns", "exec", beta_ns, "ping", "-c2", "-W1", address, check=False).returncode
        != 0
    )

    # PENDING(namescon, DNS): the guest resolves the stand-in's name
    # (`getent hosts <vm>.<project>.internal`) once per-network DNS is on main.
    # PENDING(namescon, consoles): the console log shows the login prompt; a hard reset brings
    # SSH back.
    # PENDING(images, live volumes): a volume attached live appears as
    # /dev/disk/by-id/virtio-<serial> inside the guest.
    print(f"real guest: boot to SSH {boot_s:.1f} s after the port forward")
