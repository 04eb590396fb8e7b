"""Spot preemption at scale: from an on-demand request on a full fleet to the decision and
the notices sent.

Creates a fresh PostgreSQL database ``kumo_bench_preempt`` on 127.0.0.1:5432 (user
postgres, trust auth), migrates it and seeds 1,000 up hosts of 8 A100 GPUs (two NUMA cells
of 4), every GPU held by a running VM: each cell packed with a seeded mix of 1/2/4-GPU VMs,
one host in ten holding a single 8-GPU VM, and one VM in eight on-demand (never a victim);
every other VM is spot, of ten projects, one of which has a guaranteed minimum. Then
REQUESTS on-demand requests (a seeded mix of 8, 4, 2 and 1 GPUs), one at a time: the pending
VM is made untimed; the clock covers ``compute.services.spot.preempt_for`` (bringing the
index of evictable spot VMs up to date, the guaranteed minimums, the decision over the
scheduler's view, and in one
committed transaction every victim's conditional update to evicting with its deadline, its
audit record and its event). Each request's victims stay evicting, so the fleet shrinks as
it would.

The same-run reference: one plain SQL query that picks the host for an 8-GPU request (the
host with the fewest VMs whose GPUs are all held by evictable spot VMs, youngest first) and
lists its victims.

Prints progress on stderr and one JSON line, last, on stdout: ``hosts``,
``decision_p50_ms``, ``decision_p99_ms`` (target: p99 under 100 ms), ``plain_sql_p50_ms``,
``plain_sql_p99_ms``, ``victims`` (mean per request), ``requests``. Drops the database at
the end, whatever happens.

Run: ``make bench-preempt`` or ``.venv/bin/python bench/preempt.py`` (about a minute).
"""

import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make the apps importable

from bench.common import django_on_throwaway_database, log, p99_ms, percentile_ms  # noqa: E402

DB_NAME = "kumo_bench_preempt"
HOSTS = 1_000
CELLS = 2
GPUS_PER_CELL = 4
GPU_MODEL = "A100-SXM4-40GB"
HOST_VCPUS = 128
HOST_MEMORY_MIB = 460 * 1024
VCPUS_PER_GPU = 16
MEMORY_GIB_PER_GPU = 57
PROJECTS = 10
REQUESTS = 200
REQUEST_MIX = {8: 40, 4: 20, 2: 20, 1: 20}
SEED = 20_240_605

PLAIN_SQL = """
SELECT d.host_id
  FROM compute_device d
  JOIN compute_host h ON h.id = d.host_id
  LEFT JOIN compute_virtualmachine v ON v.id = d.vm_id
 WHERE h.state = 'up' AND d.kind = 'gpu' AND d.present AND d.model = %s
 GROUP BY d.host_id
HAVING count(*) FILTER (
         WHERE v.id IS NOT NULL
           AND (v.priority <> 'spot' OR v.state NOT IN ('running', 'stopped')
                OR v.task_state <> '')) = 0
 ORDER BY count(DISTINCT d.vm_id), max(v.created_at) DESC
 LIMIT 1
"""
PLAIN_VICTIMS = """
SELECT DISTINCT d.vm_id FROM compute_device d WHERE d.host_id = %s AND d.vm_id IS NOT NULL
"""


def _cell_sizes(rng: random.Random) -> list[int]:
    sizes, left = [], GPUS_PER_CELL
    while left:
        size = rng.choice([s for s in (1, 2, 4) if s <= left])
        sizes.append(size)
        left -= size
    return sizes


def seed() -> dict:
    """The full fleet; returns the templates, the image and the requesting project."""
    from django.db import connection
    from django.utils import timezone

    from compute.choices import DeviceKind, HostState, ImageFormat, PowerState, VmState
    from compute.models import Device, Host, VirtualMachine
    from compute.services import catalog, spot
    from tenants import services as tenants

    rng = random.Random(SEED)
    cell_memory = HOST_MEMORY_MIB // CELLS
    user = tenants.user_create(username="bench")
    projects = []
    for i in range(PROJECTS + 1):
        project = tenants.project_create(slug=f"bench-{i}", name=f"Bench {i}", owner=user)
        tenants.quota_set(project=project, vcpus=10**6, memory_gib=10**7, gpus=10**5, vms=10**5)
        projects.append(project)
    templates = {
        gpus: catalog.template_create(
            name=f"gpu-{gpus}",
            vcpus=VCPUS_PER_GPU * gpus,
            memory_gib=MEMORY_GIB_PER_GPU * gpus,
            gpus=gpus,
            gpu_model=GPU_MODEL,
        )
        for gpus in (1, 2, 4, 8)
    }
    image = catalog.image_create(
        name="ubuntu-24.04",
        os_distro="ubuntu",
        format=ImageFormat.QCOW2,
        location="/var/lib/kumo/images/ubuntu-24.04.qcow2",
        checksum="sha256:" + "0" * 64,
    )
    hosts = Host.objects.bulk_create(
        (
            Host(
                name=f"gpu{i:05d}",
                state=HostState.UP,
                rack=f"rack{i // 40:03d}",
                hypervisor="kvm",
                vcpus=HOST_VCPUS,
                memory_mib=HOST_MEMORY_MIB,
                vcpus_used=HOST_VCPUS,
                memory_mib_used=MEMORY_GIB_PER_GPU * 8 * 1024,
                numa_cells=[
                    {"id": c, "cpus": HOST_VCPUS // CELLS, "memory_mib": cell_memory}
                    for c in range(CELLS)
                ],
            )
            for i in range(HOSTS)
        ),
        batch_size=1000,
    )
    now = timezone.now()
    vms, holders = [], []  # holders: (host, cell or None, gpus, vm)
    for host in hosts:
        layout = [(None, 8)] if rng.random() < 0.1 else [
            (cell, size) for cell in range(CELLS) for size in _cell_sizes(rng)
        ]  # fmt: skip
        for cell, gpus in layout:
            vm = VirtualMachine(
                project=projects[rng.randrange(1, PROJECTS + 1)],
                name=f"vm{len(vms):06d}",
                template=templates[gpus],
                image=image,
                priority="on_demand" if rng.random() < 0.125 else "spot",
                vcpus=VCPUS_PER_GPU * gpus,
                memory_mib=MEMORY_GIB_PER_GPU * gpus * 1024,
                gpus=gpus,
                gpu_model=GPU_MODEL,
                disk_gib=100,
                state=VmState.RUNNING,
                power_state=PowerState.RUNNING,
                host=host,
                numa_cell=cell,
                generation=2,
                applied_generation=2,
            )
            vms.append(vm)
            holders.append((host, cell, gpus, vm))
    VirtualMachine.objects.bulk_create(vms, batch_size=2000)
    # created_at is auto_now_add: spread the ages so "youngest" means something.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE compute_virtualmachine SET created_at = %s - (random() * interval '30 days')",
            [now],
        )
    devices, used = [], {}
    for host, cell, gpus, vm in holders:
        first = 0 if cell is None else cell * GPUS_PER_CELL + used.get((host.pk, cell), 0)
        used[(host.pk, cell)] = used.get((host.pk, cell), 0) + gpus
        for slot in range(first, first + gpus):
            devices.append(
                Device(
                    host=host,
                    name=f"pci_0000_{slot:02x}_00_0",
                    pci_address=f"0000:{slot:02x}:00.0",
                    kind=DeviceKind.GPU,
                    model=GPU_MODEL,
                    vendor_id=0x10DE,
                    product_id=0x20B0,
                    class_code=0x030200,
                    numa_node=slot // GPUS_PER_CELL,
                    iommu_group=slot,
                    vm=vm,
                )
            )
    Device.objects.bulk_create(devices, batch_size=5000)
    # Set once the fleet exists: a minimum beyond the fleet's GPUs is refused.
    spot.guarantee_set(project=projects[1], min_gpus=64, gpu_model=GPU_MODEL)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"templates": templates, "image": image, "project": projects[0], "vms": len(vms)}


def measure(world: dict) -> dict:
    from django.db import connection, transaction

    from compute import placement
    from compute.models import VirtualMachine
    from compute.services import spot

    placement.view.get(fresh=True)  # the view a failed placement just loaded
    rng = random.Random(SEED + 1)
    sizes = rng.choices(list(REQUEST_MIX), weights=list(REQUEST_MIX.values()), k=REQUESTS)
    latencies, victims, misses = [], 0, 0
    for i, gpus in enumerate(sizes):
        template = world["templates"][gpus]
        vm = VirtualMachine.objects.create(
            project=world["project"],
            name=f"want{i:05d}",
            template=template,
            image=world["image"],
            vcpus=template.vcpus,
            memory_mib=template.memory_gib * 1024,
            gpus=gpus,
            gpu_model=GPU_MODEL,
            disk_gib=100,
        )
        vm = VirtualMachine.objects.select_related("project").get(pk=vm.pk)
        t0 = time.perf_counter()
        with transaction.atomic():
            decision = spot.preempt_for(vm)
        latencies.append(time.perf_counter() - t0)
        if decision is None:
            misses += 1
        else:
            victims += len(decision.victims)
    plain = []
    with connection.cursor() as cursor:
        for _ in range(REQUESTS):
            t0 = time.perf_counter()
            cursor.execute(PLAIN_SQL, [GPU_MODEL])
            row = cursor.fetchone()
            if row:
                cursor.execute(PLAIN_VICTIMS, [row[0]])
                cursor.fetchall()
            plain.append(time.perf_counter() - t0)
    return {
        "decision_p50_ms": percentile_ms(latencies, 50),
        "decision_p99_ms": p99_ms(latencies),
        "plain_sql_p50_ms": percentile_ms(plain, 50),
        "plain_sql_p99_ms": p99_ms(plain),
        "requests": REQUESTS,
        "victims_per_request": round(victims / max(REQUESTS - misses, 1), 2),
        "no_preemption_possible": misses,
    }


def main() -> None:
    began = time.monotonic()
    with django_on_throwaway_database(DB_NAME, KUMO_SCHEDULER_VIEW_TTL_S="3600"):
        log(f"seeding {HOSTS} full hosts")
        t0 = time.perf_counter()
        world = seed()
        log(f"seeded {world['vms']} VMs in {time.perf_counter() - t0:.1f} s")
        result = {"hosts": HOSTS}
        result |= measure(world)
    result["wall_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
