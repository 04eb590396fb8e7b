"""The controller at fleet scale: what 5,000 hosts report, every 30 s, through Redis and
PostgreSQL, handled by 1 and then 2 controller processes.

Creates a fresh PostgreSQL database ``kumo_bench_reports``, migrates it and enrolls
``HOSTS`` hosts, each running ``GUESTS`` VMs (written in bulk, as a fleet that has been up for
a while). Then, for each controller count, it starts that many controller processes exactly as
``manage.py run`` and ``deploy/`` start one (``celery worker --queues control --pool threads
--concurrency 4``) on a private Redis database, and feeds them for ``SECONDS`` seconds what the
fleet's agents send, at the fleet's rate, with the agents' own report code
(``controlplane.agent.reports.send``): per host and period a heartbeat, a guests report with
its ``GUESTS`` guests, and a network report, spread evenly over the period.

Each worker loads ``bench/reports_probe.py``, which records for every report the time from
``sent_at`` to the end of its handling in Redis. The figures, per controller count:

- ``arrival_per_s``: reports sent per second (the fleet's rate);
- ``processed_per_s``: reports handled per second over the feeding window;
- ``backlog_end``: reports still queued when feeding stopped;
- ``p99_ms``: 99th percentile from sent to handled.

The target: 2 controllers keep up with 5,000 hosts, ``processed_per_s`` >= 1.5 x
``arrival_per_s`` with a backlog that does not grow. Prints progress on stderr and one JSON
line on stdout with both runs, the last one's figures at the top level. Drops the database
and flushes its Redis database at the end, whatever happens.

Run: ``make bench-reports`` or ``.venv/bin/python bench/reports.py`` (about 3 minutes);
``--hosts N`` and ``--seconds S`` for a smaller fleet or a shorter run.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import PG_URL, django_on_throwaway_database, log, p99_ms  # noqa: E402

DB_NAME = "kumo_bench_reports"
REDIS_URL = os.environ.get("KUMO_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
PERIOD_S = 30.0  # each host sends each report once a period
GUESTS = 8
PROBE_KEY = "kumo-bench-reports:done"


def seed(hosts: int) -> list[dict]:
    """``hosts`` up hosts with ``GUESTS`` running VMs each; returns per host the guests it
    reports (``vm_id``, ``generation``, ``power``)."""
    from django.db import connection

    from compute.choices import HostState, ImageFormat, PowerState, VmState
    from compute.models import Host, VirtualMachine
    from compute.services import catalog
    from tenants import services as tenants

    user = tenants.user_create(username="bench")
    project = tenants.project_create(slug="bench", name="Bench", owner=user)
    tenants.quota_set(project=project, vcpus=10**7, memory_gib=10**8, gpus=10**6, vms=10**6)
    template = catalog.template_create(name="cpu-4", vcpus=4, memory_gib=8)
    image = catalog.image_create(
        name="debian-12",
        os_distro="debian",
        format=ImageFormat.QCOW2,
        location="/var/lib/kumo/images/debian-12.qcow2",
        checksum="sha256:" + "0" * 64,
    )
    rows = Host.objects.bulk_create(
        (
            Host(
                name=f"host{i:05d}",
                state=HostState.UP,
                hypervisor="kvm",
                vcpus=128,
                memory_mib=512 * 1024,
                vcpus_used=4 * GUESTS,
                memory_mib_used=8 * 1024 * GUESTS,
                numa_cells=[{"id": 0, "cpus": 128, "memory_mib": 512 * 1024}],
            )
            for i in range(hosts)
        ),
        batch_size=1000,
    )
    vms = [
        VirtualMachine(
            project=project,
            name=f"vm{h:05d}-{g}",
            template=template,
            image=image,
            vcpus=4,
            memory_mib=8 * 1024,
            disk_gib=40,
            state=VmState.RUNNING,
            power_state=PowerState.RUNNING,
            host=host,
            numa_cell=0,
            generation=2,
            applied_generation=2,
        )
        for h, host in enumerate(rows)
        for g in range(GUESTS)
    ]
    VirtualMachine.objects.bulk_create(vms, batch_size=2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    guests: list[list[dict]] = [[] for _ in rows]
    index = {host.pk: i for i, host in enumerate(rows)}
    for vm in vms:
        guests[index[vm.host_id]].append(
            {"vm_id": str(vm.pk), "generation": 2, "power": "running", "cpu_time_ns": 0}
        )
    return [{"host": host.name, "guests": g} for host, g in zip(rows, guests, strict=True)]


def controllers(count: int, env: dict) -> list[subprocess.Popen]:
    argv = [
        sys.executable, "-m", "celery", "-A", "controlplane.celery", "worker",
        "--queues", "control", "--pool", "threads", "--concurrency", "4",
        "--without-gossip", "--without-mingle", "--loglevel", "WARNING",
        "--include", "bench.reports_probe",
    ]  # fmt: skip
    return [
        subprocess.Popen(
            [*argv, "--hostname", f"bench-controller-{i}-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(Path(env["KUMO_VAR_DIR"]) / f"controller-{i}.log", "w"),
        )
        for i in range(count)
    ]


def stop(processes: list[subprocess.Popen]) -> None:
    for proc in processes:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in processes:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def feed(fleet: list[dict], seconds: float) -> int:
    """Send the fleet's reports at its rate for ``seconds``; returns how many were sent."""
    import controlplane.celery  # noqa: F401  (the controller's app: reports go to its broker)
    from compute.protocol import GUESTS_REPORT
    from controlplane.agent import reports
    from network.protocol import NETWORK_APPLIED_REPORT

    kinds = ("heartbeat", GUESTS_REPORT, NETWORK_APPLIED_REPORT)
    slots = [(host, kind) for kind in kinds for host in fleet]
    interval = PERIOD_S / len(slots)  # every (host, kind) once a period, evenly spread
    start = time.monotonic()
    sent = 0
    while (now := time.monotonic() - start) < seconds:
        due = int(now / interval) + 1
        while sent < due:
            host, kind = slots[sent % len(slots)]
            reports.send(host["host"], kind, payload(host, kind))
            sent += 1
        time.sleep(min(interval, 0.005))
    return sent


def payload(host: dict, kind: str) -> dict:
    if kind == "heartbeat":
        return {"version": "bench", "libvirt_uri": "qemu:///system", "capabilities": []}
    if kind == "network.applied":
        return {"vtep": "", "applied_generation": 0, "ok": True}
    return {"guests": host["guests"]}


def measure(fleet: list[dict], count: int, seconds: float, env: dict) -> dict:
    import redis

    from controlplane.broker import CONTROL_QUEUE

    r = redis.Redis.from_url(REDIS_URL)
    r.flushdb()
    workers = controllers(count, env)
    try:
        time.sleep(4)  # the workers connect before the feed starts
        if any(w.poll() is not None for w in workers):
            raise RuntimeError("a controller exited at start; see its log in KUMO_VAR_DIR")
        log(f"{count} controller(s): feeding {len(fleet)} hosts for {seconds:.0f} s")
        started = time.time()
        sent = feed(fleet, seconds)
        ended = time.time()
        backlog = r.llen(CONTROL_QUEUE)
        done = [json.loads(x) for x in r.lrange(PROBE_KEY, 0, -1)]
    finally:
        stop(workers)
        r.flushdb()
    window = ended - started
    handled = [d for d in done if started <= d["done"] <= ended]
    return {
        "hosts": len(fleet),
        "controllers": count,
        "arrival_per_s": round(sent / window, 1),
        "processed_per_s": round(len(handled) / window, 1),
        "backlog_end": backlog,
        "p99_ms": p99_ms([d["latency_s"] for d in handled]) if handled else None,
        "sent": sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    wall = time.monotonic()
    with django_on_throwaway_database(DB_NAME, CELERY_BROKER_URL=REDIS_URL):
        log(f"seeding {args.hosts} hosts with {GUESTS} guests each")
        fleet = seed(args.hosts)
        env = {
            **os.environ,
            "DATABASE_URL": f"{PG_URL}/{DB_NAME}",
            "CELERY_BROKER_URL": REDIS_URL,
            "KUMO_BENCH_REPORTS_REDIS": REDIS_URL,
            "PYTHONPATH": str(ROOT),
        }
        runs = [measure(fleet, count, args.seconds, env) for count in (1, 2)]
    last = runs[-1]
    print(
        json.dumps(
            {
                **{k: last[k] for k in ("hosts", "controllers", "arrival_per_s")},
                **{k: last[k] for k in ("processed_per_s", "backlog_end", "p99_ms")},
                "keeps_up": last["processed_per_s"] >= 1.5 * last["arrival_per_s"],
                "runs": runs,
                "wall_s": round(time.monotonic() - wall, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
