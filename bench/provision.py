"""Provisioning latency: API POST to a running guest, beside the bare libvirt define + start.

Creates a fresh PostgreSQL database ``kumo_bench_provision`` on 127.0.0.1:5432 (user
postgres, trust auth; ``KUMO_BENCH_PROVISION_DB`` names another) and uses Redis database 14
on 127.0.0.1:6379 as the broker (``KUMO_BENCH_REDIS_URL`` another; flushed before and
after). Seeds a project with room, a 1-GPU template, an image and a token, writes
GPU_HOSTS simulated 8x A100 nodes (libvirt's test driver) and starts the real topology
(gunicorn, the controller, beat, one agent per host) as ``manage.py run`` does. Then, one
VM at a time so each figure is one VM's own path:

- kumo: ``POST /api/v1/projects/<slug>/vms/`` with ``wait_for_capacity: false``, timed from
  just before the request to the moment the controller records the guest running
  (``launched_at``, written when the agent's report arrives). The path: the API validates,
  claims a GPU in one transaction and answers 202; after commit the host's work goes through
  Redis to the agent, which writes the cloud-init seed and NCCL topology, defines and starts
  the domain, and reports back through Redis to the controller, which moves the VM to
  running. Both clocks are this machine's.
- libvirt: the reference, measured in this process in the same run, alternating with the
  Kumo VMs: ``defineXML`` + ``create`` of the same domain XML Kumo builds, on a test-driver
  connection to a node file of the same kind.

Prints progress on stderr and one JSON line, last, on stdout: ``vms``, ``p50_ms``,
``p95_ms``, ``post_p50_ms`` (the POST's own answer) and ``after_post_p50_ms`` (from the
202 to ``launched_at``: the agent, Redis and the controller), ``libvirt_p50_ms``,
``overhead_p50_ms`` (Kumo's p50 less libvirt's), and
``target_overhead_p50_ms`` with ``met``. Target: overhead p50 <= 50 ms. Stops every
process, drops the database and flushes the Redis database at the end, whatever happens;
removes its folder (the fleet's files, the processes' logs) when the run ended with its
line, and names it when not.

Run: ``make bench-provision`` or ``.venv/bin/python bench/provision.py`` (about a minute).
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make the apps importable

from bench.common import (  # noqa: E402
    PG_URL,
    log,
    percentile_ms,
    recreate_database,
    terminated_as_interrupted,
)

DB_NAME = os.environ.get("KUMO_BENCH_PROVISION_DB", "kumo_bench_provision")
REDIS_URL = os.environ.get("KUMO_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
TARGET_OVERHEAD_P50_MS = 50  # at most
GPU_HOSTS = 4
VMS = 30  # 1-GPU VMs, at most 8 per host
WARMUP = 2


def flush_redis() -> None:
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


def seed():
    from compute.models import VirtualMachine  # noqa: F401 - apps are loaded
    from tenants import services as tenants
    from tests.factories import UserFactory, make_image, make_project, make_template, token_for

    owner = UserFactory()
    project = make_project(owner=owner)
    tenants.quota_set(project=project, vcpus=4096, memory_gib=65536, gpus=256, vms=256)
    template = make_template(gpus=1)
    return project, template.name, make_image().pk, token_for(owner)


class LibvirtReference:
    """The bare libvirt path: define + start Kumo's own domain XML on a test-driver node."""

    def __init__(self, node_file: Path):
        import libvirt

        from compute.drivers import simnode

        self.conn = libvirt.open(f"test://{node_file}")
        self.cells = simnode.host_cells("gpu")
        self.gpus = [d for d in simnode.host_devices("gpu") if d.kind == "gpu"]

    def once(self, index: int) -> float:
        from compute.drivers.base import GuestSpec, PassthroughDevice
        from compute.drivers.domain_xml import build_domain_xml

        gpu = self.gpus[index % len(self.gpus)]
        spec = GuestSpec(
            vm_id=str(uuid.uuid4()),
            generation=1,
            name="bench",
            vcpus=16,
            memory_mib=57 * 1024,
            numa_cell=gpu.numa_node,
            devices=(
                PassthroughDevice(
                    address=gpu.address,
                    kind=gpu.kind,
                    numa_node=gpu.numa_node,
                    vendor_id=gpu.vendor_id,
                    product_id=gpu.product_id,
                ),
            ),
        )
        xml = build_domain_xml(spec, cells=self.cells)  # untimed: Kumo builds it on the host
        start = time.perf_counter()
        dom = self.conn.defineXML(xml)
        dom.create()
        elapsed = time.perf_counter() - start
        dom.destroy()
        dom.undefine()
        return elapsed


def main() -> None:
    var_dir = Path(tempfile.mkdtemp(prefix="kumo-bench-provision-"))
    os.environ.update(
        DATABASE_URL=f"{PG_URL}/{DB_NAME}",
        CELERY_BROKER_URL=REDIS_URL,
        KUMO_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        KUMO_HEARTBEAT_INTERVAL_S="2",
    )
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    recreate_database(DB_NAME)
    flush_redis()
    import django

    django.setup()
    import httpx
    from django.core.management import call_command

    from compute.choices import HostState
    from compute.management.commands.simfleet import write_and_register
    from compute.models import Host, VirtualMachine
    from controlplane.management.commands.run import topology
    from tests.e2e.processes import Fleet, free_port, wait_for

    call_command("migrate", interactive=False, verbosity=0)
    project, template, image, token = seed()
    hosts = [f"gpu-{i + 1:02d}" for i in range(GPU_HOSTS)]
    uris = write_and_register(var_dir / "fleet", hosts)
    port = free_port()
    fleet = Fleet(dict(os.environ), var_dir)
    done = False
    try:
        for name, argv in topology(
            sys.executable, bind=f"127.0.0.1:{port}", hosts=hosts, uris=uris
        ).items():
            fleet.start(name, argv)
        wait_for(
            lambda: Host.objects.filter(name__in=hosts, state=HostState.UP).count() == len(hosts),
            timeout=120,
            what="agents up",
            fleet=fleet,
        )
        log(f"{len(hosts)} simulated GPU hosts up; {VMS} VMs, one at a time")
        reference = LibvirtReference(var_dir / "fleet" / "gpu-01.xml")
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=30,
            headers={"Authorization": f"Bearer {token}"},
        )
        url = f"/api/v1/projects/{project.slug}/vms/"
        kumo, posts, bare = [], [], []
        for index in range(WARMUP + VMS):
            body = {
                "name": f"bench-{index}",
                "template": template,
                "image": image,
                "wait_for_capacity": False,
            }
            started = time.time()
            response = api.post(url, json=body)
            answered = time.time()
            if response.status_code != 202:
                raise SystemExit(f"create answered {response.status_code}: {response.text}")
            vm_id = response.json()["id"]
            launched = wait_for(
                lambda vm_id=vm_id: (
                    VirtualMachine.objects.filter(pk=vm_id, launched_at__isnull=False)
                    .values_list("launched_at", flat=True)
                    .first()
                ),
                timeout=60,
                what=f"vm {vm_id} running",
                fleet=fleet,
                interval=0.002,
            )
            elapsed = launched.timestamp() - started
            libvirt_s = reference.once(index)
            if index >= WARMUP:
                kumo.append(elapsed)
                posts.append((answered - started, launched.timestamp() - answered))
                bare.append(libvirt_s)
        result = {
            "vms": len(kumo),
            "p50_ms": round(statistics.median(kumo) * 1000, 2),
            "p95_ms": percentile_ms(kumo, 95),
            "post_p50_ms": round(statistics.median(p for p, _ in posts) * 1000, 2),
            "after_post_p50_ms": round(statistics.median(a for _, a in posts) * 1000, 2),
            "libvirt_p50_ms": round(statistics.median(bare) * 1000, 3),
        }
        result["overhead_p50_ms"] = round(result["p50_ms"] - result["libvirt_p50_ms"], 2)
        result["target_overhead_p50_ms"] = TARGET_OVERHEAD_P50_MS
        result["met"] = result["overhead_p50_ms"] <= TARGET_OVERHEAD_P50_MS
        print(json.dumps(result), flush=True)
        done = True
    finally:
        fleet.stop()
        from django.db import connections

        connections.close_all()
        recreate_database(DB_NAME, drop_only=True)
        flush_redis()
        if done:
            shutil.rmtree(var_dir)
        else:  # the processes' logs, for what went wrong
            log(f"the run's folder is kept: {var_dir}")


if __name__ == "__main__":
    with terminated_as_interrupted():  # a SIGTERM still drops the database
        main()
