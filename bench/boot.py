"""A real boot through Kumo against the same boot with bare libvirt, in the same run.

Starts the real topology (the API under gunicorn, the controller, beat, and two host agents
over the embedded broker) on a fresh PostgreSQL database ``kumo_bench_boot``: host
``real-01`` drives ``qemu:///system`` (KVM where it boots, else TCG: ``KUMO_GUEST_ACCEL``),
``gpu-01`` is a simulated GPU node and the project's gateway, each in its namespace of a
simulated fabric (``network.simfabric``). One project, one network with external access,
the user's SSH key, Kumo's image (``make image-file``) and a 1-vCPU, 1-GiB template.

Each of BOOTS Kumo boots: the clock starts at the API's ``POST /vms/``; the bench then adds
a port forward from the project's global IP to the VM's port (as a user would) and polls
``ssh -i <the user's key>`` from the simulated outside (``kumo-sim-ext``'s stand-in) until
it logs in and runs a command; the VM is deleted untimed.

Each of BOOTS bare boots: a port on the same network and host, made through the API untimed
(the network agent bridges it) with its own port forward; the clock starts at the tap's
creation, then ``virsh create`` of the equivalent domain (the same domain XML builder, the
same image under a fresh overlay, a seed with the same key and network configuration), the
tap handed into the host's namespace as Kumo's agent does, and the same SSH poll.

Prints progress on stderr and one JSON line, last, on stdout: ``boots``,
``api_to_ssh_p50_s``, ``bare_to_ssh_p50_s``, ``overhead_p50_s`` (target: at most 1 s or 5 %
of the bare boot, whichever is larger), ``accel``, ``ssh_ok`` (every boot answered), and the
single boots. Removes everything it made at the end, whatever happens.

Run: ``make bench-boot`` (root, after ``make kvm-host`` and ``make image-file``), or
``.venv/bin/python bench/boot.py [BOOTS]``. Under TCG on two cores, budget about two to
four minutes per boot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make the apps importable

from bench.common import django_on_throwaway_database, log  # noqa: E402

DB_NAME = "kumo_bench_boot"
BOOTS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
REAL, SIM = "real-01", "gpu-01"  # gpu-01: a simulated GPU node, where CPU VMs never go
CIDR = "10.43.0.0/24"
SSH_TIMEOUT_S = 900


def sh(*argv, check=True, timeout=60):
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=check, timeout=timeout
    )


def ssh_ok(key: Path, netns: str, address: str, port: int) -> bool:
    argv = [
        "ip", "netns", "exec", netns, "ssh", "-i", key, "-p", port,
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "ConnectTimeout=3", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
        f"debian@{address}", "true",
    ]  # fmt: skip
    return sh(*argv, check=False, timeout=30).returncode == 0


def wait_ssh(key, netns, address, port, start: float) -> float | None:
    while time.monotonic() - start < SSH_TIMEOUT_S:
        if ssh_ok(key, netns, address, port):
            return time.monotonic() - start
        time.sleep(0.5)
    return None


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> None:
    prefix = f"kb{uuid.uuid4().hex[:4]}"
    instances = Path(tempfile.mkdtemp(prefix="kumo-bench-boot-", dir="/tmp"))
    instances.chmod(0o755)
    with django_on_throwaway_database(DB_NAME), tempfile.TemporaryDirectory() as var:
        from network import simfabric

        sims = simfabric.ensure([SIM, REAL], gateway=SIM, prefix=prefix)
        bare_domains: list[str] = []
        fleet = None
        try:
            fleet = _start(Path(var), instances, {h.name: h for h in sims})
            result = _run(fleet, prefix, instances, bare_domains, {h.name: h for h in sims})
        finally:
            if fleet is not None:
                fleet.stop()
            _cleanup(prefix, sims, bare_domains, instances)
    print(json.dumps(result), flush=True)


def _start(var: Path, instances: Path, sims):
    from compute.management.commands.simfleet import write_and_register
    from network import simfabric
    from network.services import global_ip_pool_create
    from tests.e2e.processes import Fleet, database_url, free_port, start_topology

    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL="filesystem://",
        KUMO_VAR_DIR=str(var),
        KUMO_INSTANCES_DIR=str(instances),
        # What the agents applied, in the folder removed at the end (not beside it).
        KUMO_AGENT_APPLIED_DIR=str(instances / "applied"),
        KUMO_HEARTBEAT_INTERVAL_S="1",
        KUMO_GUESTS_REPORT_INTERVAL_S="2",
        KUMO_RECONCILE_GRACE_S="5",
        KUMO_NETWORK_REPORT_INTERVAL_S="2",
        KUMO_NETWORK_SYNC_S="2",
        KUMO_LOG_LEVEL="INFO",
    )
    fleet = Fleet(env, var)
    uris = write_and_register(var / "fleet", [SIM])
    uris[REAL] = "qemu:///system"
    global_ip_pool_create(
        name="bench", cidr=simfabric.EXTERNAL_CIDR, gateway_ip=simfabric.EXTERNAL_GATEWAY
    )
    port = free_port()
    fleet.port = port
    start_topology(
        fleet,
        bind=f"127.0.0.1:{port}",
        hosts=[SIM, REAL],
        uris=uris,
        agent_args={name: sim.agent_args() for name, sim in sims.items()},
    )
    return fleet


def _run(fleet, prefix, instances, bare_domains, sims) -> dict:
    import httpx
    from django.contrib.auth import get_user_model

    from compute.choices import HostState
    from compute.imagebuild import cached_image
    from compute.models import Host
    from compute.services import template_create
    from compute.services.guest_image import guest_image_register
    from network import simfabric
    from network.models import HostNetwork
    from network.services import network_create
    from tenants import services as tenants

    built = cached_image()
    if built is None:
        raise SystemExit("Kumo's guest image is not built: make image-file")

    def ready():
        up = Host.objects.filter(name__in=[SIM, REAL], state=HostState.UP).count() == 2
        nets = HostNetwork.objects.filter(host__name__in=[SIM, REAL], vtep_address__isnull=False)
        return up and nets.count() == 2

    wait_for(ready, 180, "both agents up")
    owner = get_user_model().objects.create_user(
        username=f"bench-{prefix}", password=uuid.uuid4().hex
    )
    project = tenants.project_create(slug=f"bench-{prefix}", name="Boot bench", owner=owner)
    tenants.quota_set(project=project, vcpus=64, memory_gib=256, gpus=0, vms=64)
    network_create(project=project, name="lab", cidr=CIDR, external_access=True)
    token = tenants.token_create(user=owner, name="bench")[1]
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{fleet.port}",
        timeout=30,
        headers={"Authorization": f"Bearer {token}"},
    )
    base = f"/api/v1/projects/{project.slug}"
    key = Path(fleet.log_dir) / "id_ed25519"
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
    pub = key.with_suffix(".pub").read_text()
    assert api.post("/api/v1/user/ssh-keys/", json={"name": "k", "public_key": pub}).is_success
    image, _ = guest_image_register(built=built)
    template = template_create(name=f"c1-{prefix}", vcpus=1, memory_gib=1, gpus=0, disk_gib=4)
    rule = {"group": "default", "direction": "ingress", "protocol": "tcp", "port_min": 22,
            "port_max": 22, "remote_cidr": "0.0.0.0/0"}  # fmt: skip
    api.post(f"{base}/security-group-rules/", json=rule).raise_for_status()
    gip = api.post(f"{base}/global-ips/", json={}).json()["address"]
    outside = simfabric.netns(simfabric.EXTERNAL, prefix)
    accel = Host.objects.get(name=REAL).guest_accel

    kumo, bare = [], []
    for i in range(BOOTS):
        log(f"kumo boot {i + 1}/{BOOTS}")
        start = time.monotonic()
        r = api.post(
            f"{base}/vms/",
            json={
                "name": f"b{i}",
                "template": template.name,
                "image": image.pk,
                "ssh_keys": ["k"],
                "nics": [{"network": "lab"}],
            },
        )
        r.raise_for_status()
        vm_id = r.json()["id"]
        port = wait_for(
            lambda vm_id=vm_id: next(
                (p for p in api.get(f"{base}/ports/").json()["results"] if p["vm"] == vm_id),
                None,
            ),
            30,
            "the VM's port",
        )
        forward = {"global_ip": gip, "protocol": "tcp", "external_port": 2200 + i,
                   "port": port["id"], "internal_port": 22}  # fmt: skip
        api.post(f"{base}/port-forwards/", json=forward).raise_for_status()
        took = wait_ssh(key, outside, gip, 2200 + i, start)
        log(f"kumo boot {i + 1}: {took}")
        kumo.append(took)
        api.delete(f"{base}/vms/{vm_id}/")
        wait_for(
            lambda vm_id=vm_id: (
                api.get(f"{base}/vms/{vm_id}/").status_code == 404
                or api.get(f"{base}/vms/{vm_id}/").json()["state"] == "deleted"
            ),
            120,
            "the VM deleted",
        )

        log(f"bare boot {i + 1}/{BOOTS}")
        took = _bare_boot(api, base, gip, 2300 + i, key, outside, sims[REAL].netns, built,
                          instances, bare_domains, i)  # fmt: skip
        log(f"bare boot {i + 1}: {took}")
        bare.append(took)

    ok = all(t is not None for t in kumo + bare)
    kumo_p50 = statistics.median([t for t in kumo if t is not None]) if any(kumo) else None
    bare_p50 = statistics.median([t for t in bare if t is not None]) if any(bare) else None
    return {
        "boots": BOOTS,
        "api_to_ssh_p50_s": round(kumo_p50, 2) if kumo_p50 else None,
        "bare_to_ssh_p50_s": round(bare_p50, 2) if bare_p50 else None,
        "overhead_p50_s": round(kumo_p50 - bare_p50, 2) if kumo_p50 and bare_p50 else None,
        "accel": accel,
        "ssh_ok": ok,
        "api_to_ssh_s": [round(t, 2) if t else None for t in kumo],
        "bare_to_ssh_s": [round(t, 2) if t else None for t in bare],
    }


def _bare_boot(api, base, gip, ext_port, key, outside, host_netns, built, instances,
               bare_domains, i) -> float | None:  # fmt: skip
    """One boot of the same image with bare libvirt on the same network and host."""
    from compute.drivers import cloudinit, domain_xml
    from compute.drivers.base import DiskSpec, GuestNic, GuestSpec, NicKind
    from compute.models import Host
    from network.drivers.netlink import Netlink
    from network.models import Network, Port
    from network.services import port_create

    network = Network.objects.get(project__slug=base.rsplit("/", 1)[1], name="lab")
    # A port bound to the real host, as a VM's is (the network agent bridges its tap).
    port = port_create(network=network, name=f"bare{i}", host=Host.objects.get(name=REAL))
    port = Port.objects.get(pk=port.pk)
    subnet = network.subnets.get()
    address = port.fixed_ips.get().address
    forward = {"global_ip": gip, "protocol": "tcp", "external_port": ext_port,
               "port": str(port.pk), "internal_port": 22}  # fmt: skip
    api.post(f"{base}/port-forwards/", json=forward).raise_for_status()
    from network.drivers.base import port_name

    tap = port_name(str(port.pk).replace("-", ""))
    vm_id = str(uuid.uuid4())
    folder = instances / f"bare-{vm_id}"
    folder.mkdir()
    overlay = folder / "root.qcow2"
    sh("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", built.path, overlay, "4G")
    nic = GuestNic(
        mac=port.mac,
        mtu=network.mtu,
        kind=NicKind.TAP,
        device=tap,
        addresses=(f"{address}/{subnet.cidr.split('/')[1]}",),
        gateway=str(subnet.gateway_ip),
    )
    seed = cloudinit.write_seed(
        folder / "seed.iso",
        instance_id=vm_id,
        hostname=f"bare{i}",
        ssh_keys=[key.with_suffix(".pub").read_text().strip()],
        nics=[nic],
    )
    spec = GuestSpec(
        vm_id=vm_id, generation=1, name=f"bare{i}", vcpus=1, memory_mib=1024,
        disks=(DiskSpec(source=str(overlay), format="qcow2"),), seed_iso=str(seed), nics=(nic,),
    )  # fmt: skip
    from compute.drivers import accel as accel_mod

    chosen = accel_mod.resolve(os.environ.get("KUMO_GUEST_ACCEL", "auto"))
    xml = domain_xml.build_domain_xml(
        spec,
        domain_type=chosen.domain_type,
        cpu_mode="" if chosen.accel == "tcg" else "host-passthrough",
        host="bench-bare",  # not the real host's agent's: it leaves this domain alone
    )
    (folder / "domain.xml").write_text(xml)
    start = time.monotonic()
    nl = Netlink()
    try:
        nl.add_tap(tap)
        sh("virsh", "-c", "qemu:///system", "create", folder / "domain.xml")
        bare_domains.append(domain_xml.domain_name(vm_id))
        inside = Netlink(host_netns)
        try:
            theirs = inside.links()
            if tap in theirs:
                inside.delete_link(theirs[tap].index, tap)
            nl.move_to_netns(nl.links()[tap].index, tap, host_netns)
        finally:
            inside.close()
    finally:
        nl.close()
    took = wait_ssh(key, outside, gip, ext_port, start)
    sh("virsh", "-c", "qemu:///system", "destroy", domain_xml.domain_name(vm_id), check=False)
    return took


def _cleanup(prefix, sims, bare_domains, instances) -> None:
    from network import simfabric
    from network.drivers.base import HostNetworks
    from network.drivers.linux import LinuxNetworkDriver

    for name in bare_domains:
        sh("virsh", "-c", "qemu:///system", "destroy", name, check=False)
    with contextlib.suppress(Exception):
        import libvirt

        conn = libvirt.open("qemu:///system")
        for dom in conn.listAllDomains(0):
            if f"<kumo:host>{REAL}</kumo:host>" in dom.XMLDesc(0) and str(instances) in dom.XMLDesc(
                0
            ):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefineFlags(0)
        conn.close()
    for host in sims:
        driver = LinuxNetworkDriver(host.netns)
        try:
            driver.resync(HostNetworks())
        finally:
            driver.close()
    simfabric.remove([SIM, REAL], prefix=prefix)
    shutil.rmtree(instances, ignore_errors=True)


if __name__ == "__main__":
    main()
