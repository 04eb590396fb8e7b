"""The real-guest test (issue 12): a Debian guest booted through Kumo's real processes and
reached over SSH.

The topology is the real one: the API (gunicorn), the controller, beat and two host agents
over the embedded broker. Host ``real-01``'s agent drives ``qemu:///system`` (KVM where it
boots, else QEMU's TCG: ``compute.drivers.accel``); host ``gpu-01`` is a simulated GPU node on
libvirt's test driver and the project's gateway. Each agent converges its own namespace of
a simulated fabric (``network.simfabric``): the real guest's tap is handed into
``real-01``'s namespace once QEMU holds it, so the guest sits on its project's VXLAN overlay.

Two guests are booted at once (Kumo's own image, ``make image-file``; 1 vCPU, 1 GiB each,
on a host that holds exactly two): ``lab-vm`` on demand and ``spot-vm`` on spot, whose
user-data script names a hook for Kumo's spot watcher. The checks run in the order a user
would meet them: both reach running through the API; ``ssh -i <the user's key>`` from the
simulated outside logs in through the project's global IP and port forwards; the guest
holds what cloud-init took from Kumo's seed (hostname, static address, gateway and MTU,
``/etc/kumo/metadata.env`` root-only, password login off); it resolves the other VM's
name and a stand-in's on its project's resolver, and not another project's; a stand-in VM
on the other host reaches it across the overlay and another project's with the same CIDR
does not; a hard reset of ``spot-vm`` brings SSH back on a new boot and its console log
shows both login prompts; a volume attached live appears inside as
``/dev/disk/by-id/virtio-<serial>`` and grows live; then an on-demand VM takes the host:
``spot-vm``'s watcher runs the hook (it writes a file to the volume) and acknowledges
before the notice ends, the VM is evicted, and the file is there when the volume is
attached, live, to ``lab-vm``; detached, the disk goes from inside ``lab-vm``.

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
from storage.protocol import POOLS
from tenants import services as tenants
from tests.e2e.processes import (
    Fleet,
    database_url,
    fail,
    free_port,
    start_topology,
    wait_for,
)
from tests.factories import UserFactory, make_network, make_pool, make_project, token_for

REAL, SIM = "real-01", "gpu-01"  # gpu-01: a simulated GPU node, where CPU VMs never go
CIDR = "10.42.0.0/24"
BOOT_TIMEOUT_S = float(os.environ.get("KUMO_TEST_BOOT_TIMEOUT_S", "600"))
# The spot guest's notice: long enough for its watcher to poll, run the hook and answer.
SPOT_NOTICE_S = 120
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
    _remove_pools(None)
    instances = Path(tempfile.mkdtemp(prefix="kumo-guest-", dir="/tmp"))
    instances.chmod(0o755)  # QEMU runs as libvirt-qemu: it must reach the overlay and seed
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL="filesystem://",
        # Under the instances folder: the resolvers' dnsmasq re-reads its names as nobody.
        KUMO_VAR_DIR=str(instances / "var"),
        KUMO_INSTANCES_DIR=str(instances),
        # What the agents applied, in the folder removed at the end (not beside it).
        KUMO_AGENT_APPLIED_DIR=str(instances / "applied"),
        # Shelved disks where QEMU (libvirt-qemu) can boot them again.
        KUMO_SHELVE_STORE=str(instances / "shelved"),
        # Volumes in pools QEMU (libvirt-qemu) can reach, under the instances folder.
        KUMO_STORAGE_POOLS=",".join(
            f"{pool}=dir:{instances / 'pools' / pool}" for pool in POOLS.values()
        ),
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
        template = make_template(
            vcpus=1, memory_gib=1, disk_gib=4, name=f"c1-{prefix}", eviction_notice_s=SPOT_NOTICE_S
        )
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
            "instances": instances,
        }
    finally:
        fleet.stop()
        stack.close()
        _remove_guests(vm_ids)
        _remove_pools(instances)
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


def _remove_pools(instances: Path | None) -> None:
    """Kumo's volume pools on libvirtd that live under ``instances`` (this run's), or
    under a folder that no longer exists (a run that died before its end): libvirtd knows
    pools by name, and the next run defines them again under its own folder."""
    import libvirt

    conn = libvirt.open("qemu:///system")
    try:
        for name in POOLS.values():
            with contextlib.suppress(libvirt.libvirtError):
                pool = conn.storagePoolLookupByName(name)
                target = pool.XMLDesc(0).split("<path>")[1].split("</path>")[0]
                ours = instances is not None and target.startswith(str(instances))
                if not (ours or not Path(target).exists()):
                    continue
                if pool.isActive():
                    pool.destroy()
                pool.undefine()
    finally:
        conn.close()


def _stand_in(
    project, network_name: str, host: Host, namespace: str, fixed_ip: str = "", name: str = ""
) -> str:
    """Make ``namespace`` a VM of ``project`` on ``host`` (a veth port into it, as the
    network tests' stand-ins, named ``name`` on the project's resolver) with its address
    (``fixed_ip``, or the next free one) and default route; returns the address."""
    from network.models import Network

    network = Network.objects.get(project=project, name=network_name)
    port = port_create(
        network=network, host=host, binding="veth", binding_netns=namespace,
        fixed_ip=fixed_ip, name=name,
    )  # fmt: skip
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


# The spot guest's user-data: a script (a #cloud-config with its own write_files would
# replace Kumo's vendor files) naming a hook that saves its work to the volume labelled
# kumo-work before the stop.
SPOT_USER_DATA = """#!/bin/sh
mkdir -p /etc/kumo
echo KUMO_SPOT_HOOK=/usr/local/bin/save-work > /etc/kumo/spot.env
cat > /usr/local/bin/save-work <<'HOOK'
#!/bin/sh
set -e
for try in $(seq 30); do disk=$(blkid -L kumo-work) && break; sleep 1; done
echo "save-work: $disk"
mkdir -p /mnt/work
mount "$disk" /mnt/work
echo "saved before $1 at $2" > /mnt/work/checkpoint.txt
sync
umount /mnt/work
echo "save-work: saved"
HOOK
chmod 755 /usr/local/bin/save-work
"""


def _state(api, url: str, *states: str) -> dict | None:
    vm = api.get(url).json()
    return vm if vm["state"] in states else None


def _login_prompts(api, url: str, hostname: str) -> int:
    """How many login prompts ``url``'s console log holds (it keeps 64 KiB, many boots of a
    guest whose kernel boots quiet)."""
    console = api.get(f"{url}console-log/")
    assert console.status_code == 200, console.text
    return console.json()["output"].count(f"{hostname} login:")


def test_a_real_guest_boots_through_the_api_and_is_reached_over_ssh(cloud):
    api, base, fleet = cloud["api"], cloud["base"], cloud["fleet"]
    prefix, staff = cloud["prefix"], cloud["staff"]

    # The real host says how its guests run; it holds exactly two 1-vCPU guests, so a
    # third on-demand VM has to take a spot VM's place.
    hosts = {h["name"]: h for h in staff.get("/api/v1/admin/hosts/").json()["results"]}
    assert hosts[REAL]["guest_accel"] in ("kvm", "tcg")
    assert hosts[SIM]["guest_accel"] == ""
    r = staff.patch(
        f"/api/v1/admin/hosts/{REAL}/", json={"cpu_allocation_ratio": 2.5 / hosts[REAL]["vcpus"]}
    )
    assert r.status_code == 200, r.text

    # API create of both at once; the scheduler puts CPU VMs on the host without GPUs.
    started = time.monotonic()
    made = {}
    for name, more in (("lab-vm", {}), ("spot-vm", {"priority": "spot",
                                                   "user_data": SPOT_USER_DATA})):  # fmt: skip
        r = api.post(
            f"{base}/vms/",
            json={"name": name, "template": cloud["template"], "image": cloud["image"],
                  "ssh_keys": ["laptop"], "nics": [{"network": "lab"}], **more},
        )  # fmt: skip
        assert r.status_code == 202, r.text
        made[name] = r.json()
        cloud["vm_ids"].append(made[name]["id"])
    urls = {name: f"{base}/vms/{vm['id']}/" for name, vm in made.items()}
    vms = {
        name: wait_for(
            lambda url=url: _state(api, url, "running", "error"),
            timeout=180,
            what=f"{name} defined and started",
            fleet=fleet,
        )
        for name, url in urls.items()
    }
    for vm in vms.values():
        assert vm["state"] == "running" and vm["host"] == REAL, vm
    ports = api.get(f"{base}/ports/").json()["results"]
    port = {name: next(p for p in ports if p.get("vm") == vm["id"]) for name, vm in vms.items()}
    address = port["lab-vm"]["fixed_ips"][0]
    network = next(n for n in api.get(f"{base}/networks/").json()["results"] if n["name"] == "lab")

    # SSH in from anywhere (the default group lets in only the project's own VMs), the
    # project's global IP and a port forward to each guest's SSH.
    rule = {"group": "default", "direction": "ingress", "protocol": "tcp", "port_min": 22,
            "port_max": 22, "remote_cidr": "0.0.0.0/0"}  # fmt: skip
    r = api.post(f"{base}/security-group-rules/", json=rule)
    assert r.status_code == 201, r.text
    gip = api.post(f"{base}/global-ips/", json={}).json()["address"]
    for name, external in (("lab-vm", 2222), ("spot-vm", 2223)):
        r = api.post(
            f"{base}/port-forwards/",
            json={"global_ip": gip, "protocol": "tcp", "external_port": external,
                  "port": port[name]["id"], "internal_port": 22},
        )  # fmt: skip
        assert r.status_code == 201, r.text

    # ssh -i <the user's key> from the simulated outside, through the global IP.
    outside_ns = simfabric.netns(simfabric.EXTERNAL, prefix)
    outside = Guest(cloud["key"], outside_ns, gip, 2222)
    spot = Guest(cloud["key"], outside_ns, gip, 2223)
    boot_s = outside.wait(BOOT_TIMEOUT_S)
    total_s = time.monotonic() - started
    print(f"real guest: API POST to SSH login {total_s:.1f} s ({hosts[REAL]['guest_accel']})")
    spot.wait(BOOT_TIMEOUT_S)

    # A hard reset of the spot guest once its first boot is done (its user-data ran): it
    # boots again while the other guest is looked at.
    wait_for(
        lambda: spot.run("test -f /etc/kumo/spot.env", check=False).returncode == 0,
        timeout=BOOT_TIMEOUT_S, what="spot-vm's user-data script run", fleet=fleet,
    )  # fmt: skip
    # A hard reset loses what is not on disk yet (its SSH host keys, under a slow TCG guest):
    # cloud-init's first boot finished and written out, as a user would before pulling the plug.
    spot.run("cloud-init status --wait >/dev/null; sudo sync")
    first_boot = spot.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert spot.run("cat /etc/kumo/spot.env").stdout.strip() == (
        "KUMO_SPOT_HOOK=/usr/local/bin/save-work"
    )
    prompts_before = _login_prompts(api, urls["spot-vm"], "spot-vm")
    r = api.post(f"{urls['spot-vm']}reset/")
    assert r.status_code == 202, r.text

    # The first boot's stages all done, none failed.
    status = outside.run("cloud-init status --wait --long", check=False).stdout
    assert "status: done" in status, status

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
    alpha = _stand_in(cloud["project"], "lab", sim_host, alpha_ns, name="alpha")
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
    _stand_in(other, "lab", sim_host, beta_ns, fixed_ip="10.42.0.77", name="beta")
    time.sleep(3)  # its port converged; then nothing of the guest answers
    assert (
        sh("ip", "netns", "exec", beta_ns, "ping", "-c2", "-W1", address, check=False).returncode
        != 0
    )

    # Names, on the project's resolver: the other VM by its bare name (the search domain)
    # and in full, the stand-in by its port's name; another project's name is not there.
    zone = f"{cloud['project'].slug}.internal"
    spot_address = port["spot-vm"]["fixed_ips"][0]

    def resolves(name: str) -> str:
        return outside.run(f"getent hosts {name}", check=False).stdout.split(" ")[0].strip()

    wait_for(
        lambda: resolves(f"alpha.{zone}") == alpha,
        timeout=60, what="the stand-in's name on the project's resolver", fleet=fleet,
    )  # fmt: skip
    assert resolves(f"spot-vm.{zone}") == spot_address
    assert resolves("spot-vm") == spot_address
    assert outside.run(f"getent hosts beta.other-{prefix}.internal", check=False).returncode != 0

    # The reset came back: SSH answers on a new boot (not the old one, still answering while
    # the reset is on its way on a busy machine), and the console log holds the login prompt
    # of each boot.
    def boot_id() -> str:
        return spot.run("cat /proc/sys/kernel/random/boot_id", check=False).stdout.strip()

    wait_for(
        lambda: boot_id() not in ("", first_boot),
        timeout=BOOT_TIMEOUT_S, what="SSH on spot-vm's new boot", fleet=fleet,
    )  # fmt: skip

    # The console log holds one more login prompt than before the reset: the new boot's.
    # (Not "the log ends in the prompt": cloud-init's last line of a boot may come after it.)
    wait_for(
        lambda: _login_prompts(api, urls["spot-vm"], "spot-vm") > prompts_before,
        timeout=180, what="the login prompt after the reset", fleet=fleet,
    )  # fmt: skip

    # A volume attached live: the guest sees its disk by serial at once, and sees it grow.
    r = api.post(f"{base}/volumes/", json={"name": "work", "size_gib": 1})
    assert r.status_code == 201, r.text
    volume = f"{base}/volumes/{r.json()['id']}/"
    r = api.post(f"{volume}attach/", json={"vm": vms["spot-vm"]["id"]})
    assert r.status_code in (200, 202), r.text
    disk = r.json()["guest_path"]
    assert disk.startswith("/dev/disk/by-id/virtio-"), disk
    wait_for(
        lambda: spot.run(f"test -b {disk}", check=False).returncode == 0,
        timeout=120, what=f"{disk} inside the running guest", fleet=fleet,
    )  # fmt: skip
    assert spot.run(f"sudo blockdev --getsize64 {disk}").stdout.strip() == str(1 << 30)
    spot.run(f"sudo mkfs.ext4 -q -L kumo-work {disk} && sudo sync")
    r = api.post(f"{volume}extend/", json={"size_gib": 2})
    assert r.status_code in (200, 202), r.text
    wait_for(
        lambda: spot.run(f"sudo blockdev --getsize64 {disk}").stdout.strip() == str(2 << 30),
        timeout=120, what="the grown volume inside the guest", fleet=fleet,
    )  # fmt: skip

    # The host is taken: an on-demand VM needs spot-vm's room. Its watcher runs the hook
    # and acknowledges before the notice ends; the VM is evicted and the taker placed.
    r = api.post(
        f"{base}/vms/",
        json={"name": "taker", "template": cloud["template"], "image": cloud["image"],
              "nics": [{"network": "lab"}]},
    )  # fmt: skip
    assert r.status_code == 202, r.text
    cloud["vm_ids"].append(r.json()["id"])
    taker = f"{base}/vms/{r.json()['id']}/"
    notice = wait_for(
        lambda: _state(api, urls["spot-vm"], "evicting", "evicted"),
        timeout=30, what="spot-vm's eviction notice", fleet=fleet,
    )  # fmt: skip
    deadline = notice["eviction_deadline"]
    evicted = wait_for(
        lambda: _state(api, urls["spot-vm"], "evicted"),
        timeout=SPOT_NOTICE_S + 120, what="spot-vm evicted", fleet=fleet,
    )  # fmt: skip
    assert evicted["eviction_acknowledged_at"] and evicted["eviction_acknowledged_at"] < deadline
    wait_for(
        lambda: api.get(taker).json()["host"] == REAL,
        timeout=60, what="the taker placed on the freed host", fleet=fleet,
    )  # fmt: skip
    assert api.delete(taker).status_code == 202  # its boot is not what this test is about

    # The volume goes to lab-vm, live: the hook's file is on it.
    r = api.post(f"{volume}detach/")
    assert r.status_code in (200, 202), r.text
    r = api.post(f"{volume}attach/", json={"vm": vms["lab-vm"]["id"]})
    assert r.status_code in (200, 202), r.text
    wait_for(
        lambda: outside.run(f"test -b {disk}", check=False).returncode == 0,
        timeout=120, what=f"{disk} inside lab-vm", fleet=fleet,
    )  # fmt: skip
    saved = outside.run(
        f"sudo mkdir -p /mnt/work && sudo mount {disk} /mnt/work && cat /mnt/work/checkpoint.txt"
        " ; sudo umount /mnt/work",
        check=False,
    ).stdout
    console = cloud["instances"] / vms["spot-vm"]["id"] / "console.log"
    text = console.read_text(errors="replace") if console.exists() else "(no console log)"
    said = [line for line in text.splitlines() if "save-work" in line or "spot-watch" in line]
    assert saved.startswith("saved before stop at "), (saved, said)

    # Detached live, the disk goes from inside the running guest.
    r = api.post(f"{volume}detach/")
    assert r.status_code in (200, 202), r.text
    wait_for(
        lambda: outside.run(f"test -e {disk}", check=False).returncode != 0,
        timeout=120, what=f"{disk} gone from lab-vm", fleet=fleet,
    )  # fmt: skip

    # Shelved, lab-vm holds nothing; unshelved, it boots its kept disk: what it wrote before
    # is there, on a new boot.
    outside.run("echo kept-across-shelve > ~/kept.txt && sync")
    before = outside.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    r = api.post(f"{urls['lab-vm']}shelve/")
    assert r.status_code == 202, r.text
    shelved = wait_for(
        lambda: _state(api, urls["lab-vm"], "shelved"),
        timeout=240, what="lab-vm shelved", fleet=fleet,
    )  # fmt: skip
    assert shelved["host"] is None
    assert (cloud["instances"] / "shelved" / f"{vms['lab-vm']['id']}.qcow2").exists()
    r = api.post(f"{urls['lab-vm']}unshelve/")
    assert r.status_code == 202, r.text
    back = wait_for(
        lambda: _state(api, urls["lab-vm"], "running", "error"),
        timeout=180, what="lab-vm unshelved and started", fleet=fleet,
    )  # fmt: skip
    if back["state"] != "running" or back["host"] != REAL:
        fail(
            f"lab-vm unshelved to {back['state']} on {back['host']}: {back['state_reason']}", fleet
        )
    outside.wait(BOOT_TIMEOUT_S)
    assert outside.run("cat ~/kept.txt").stdout.strip() == "kept-across-shelve"
    assert outside.run("cat /proc/sys/kernel/random/boot_id").stdout.strip() != before
    print(f"real guest: boot to SSH {boot_s:.1f} s after the port forward")
