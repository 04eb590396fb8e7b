"""The controller at fleet scale: what 5,000 hosts report, every 30 s, through Redis and
PostgreSQL, handled by 1 and then 2 controller processes.

Creates a fresh PostgreSQL database ``kumo_bench_reports``, migrates it and enrolls
``HOSTS`` hosts, each running ``GUESTS`` VMs and converged on its network (written in bulk,
as a fleet that has been up for a while). Then, for each controller count, it starts that
many controller processes exactly as ``manage.py run`` and ``deploy/`` start one (``celery
worker --queues control --pool threads --concurrency 4``) on a private Redis database
(``KUMO_BENCH_REDIS_URL``, default db 13), and sends them what the fleet's agents send, with
the agents' own report code (``controlplane.agent.reports``): per host and period a
heartbeat, a guests report with its ``GUESTS`` guests (half of them busy, their CPU time
growing) and a network report, bundled in one message as the agent bundles the reports that
fall due together (``--unbundled``: each alone, as agents sent them before).

Each controller loads ``bench/reports_probe.py``, which records for every message handled
how many reports it carried and the time from its ``sent_at`` to the end of its handling.

What is measured, per controller count, and why both ways: a queue fed at the fleet's rate
is handled at most at that rate, so the rate handled then says only that the controllers
kept up, not by how much. So:

1. Capacity: one period of the whole fleet's reports (every host's, once) is queued before
   the controllers start; ``processed_per_s`` is the reports they handle per second
   draining it (first to last handled, their start-up excluded), which is their
   throughput. ``cpu_ms_per_message`` and ``db_cpu_ms_per_message`` are the CPU the
   controllers, and PostgreSQL's processes serving them, used per message over the drain
   (from the first message handled); ``cpu_bound_per_s`` the reports per second that CPU
   makes of the machine's 2 cores were they free (the machine is shared: the measured
   throughput moves with the others' load, this much less).
2. Keeping up: then, for ``SECONDS``, the fleet's reports at the fleet's rate (every
   host's each period, evenly spread): ``arrival_per_s``, ``kept_up_per_s`` (reports
   handled per second in the window), ``backlog_end`` (messages still queued when the feed
   stops, ``backlog_end_s`` the seconds of arrivals that is), ``queue_samples`` (the queue
   along the window) and ``p99_ms`` (sent to handled).

``target_met``: ``processed_per_s`` >= 1.5 x ``arrival_per_s`` and a backlog that does not
grow (at most one second of arrivals queued at the end of the window). The target is
that 2 controllers on the 2-core machine keep up with 5,000 hosts. Prints progress on
stderr and one JSON line on stdout with both runs, the last one's (2 controllers) figures
at the top level. Drops the database and flushes its Redis database at the end, whatever
happens.

Run: ``make bench-reports`` or ``.venv/bin/python bench/reports.py`` (4 to 6 minutes);
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
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import PG_URL, django_on_throwaway_database, log, p99_ms  # noqa: E402

DB_NAME = "kumo_bench_reports"
REDIS_URL = os.environ.get("KUMO_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
PERIOD_S = 30.0  # each host sends each report once a period
GUESTS = 8
PROBE_KEY = "kumo-bench-reports:done"
T0 = time.time()  # the guests' CPU time counts from here
TARGET = 1.5  # capacity over arrival the controllers must reach
# What every host's agent says of itself in its heartbeat, as the seeded hosts have it.
HEARTBEAT = {
    "version": "bench",
    "started_at": "2026-01-01T00:00:00+00:00",
    "libvirt_uri": "qemu:///system",
    "capabilities": ["compute", "controlplane", "network", "storage"],
}


def seed(hosts: int) -> list[dict]:
    """``hosts`` up hosts with ``GUESTS`` running VMs each; returns per host the guests it
    reports (``vm_id``, ``generation``, ``power``)."""
    from django.db import connection
    from django.utils import timezone

    from compute.choices import HostState, ImageFormat, PowerState, VmState
    from compute.models import Host, VirtualMachine
    from compute.services import catalog
    from network.models import HostNetwork
    from tenants import services as tenants

    now = timezone.now()

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
                agent_version=HEARTBEAT["version"],
                agent_started_at=datetime.fromisoformat(HEARTBEAT["started_at"]),
                libvirt_uri=HEARTBEAT["libvirt_uri"],
                capabilities=HEARTBEAT["capabilities"],
                last_heartbeat_at=now - timedelta(seconds=PERIOD_S),
                guests_reported_at=now - timedelta(seconds=PERIOD_S),
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
            launched_at=now,
        )
        for h, host in enumerate(rows)
        for g in range(GUESTS)
    ]
    VirtualMachine.objects.bulk_create(vms, batch_size=2000)
    HostNetwork.objects.bulk_create(
        (
            HostNetwork(
                host=host,
                vtep_address=_vtep(i),
                underlay_device="eth0",
                underlay_mtu=9000,
                desired_generation=1,
                applied_generation=1,
                reported_at=now - timedelta(seconds=PERIOD_S),
            )
            for i, host in enumerate(rows)
        ),
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    guests: list[list[dict]] = [[] for _ in rows]
    index = {host.pk: i for i, host in enumerate(rows)}
    for vm in vms:
        guests[index[vm.host_id]].append(
            {"vm_id": str(vm.pk), "generation": 2, "power": "running", "cpu_time_ns": 0}
        )
    return [
        {"host": host.name, "guests": g, "vtep": _vtep(i)}
        for i, (host, g) in enumerate(zip(rows, guests, strict=True))
    ]


def _vtep(i: int) -> str:
    return f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"


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


def feed(fleet: list[dict], seconds: float | None, *, bundled: bool, started: float) -> tuple:
    """Send the fleet's reports, for ``seconds`` at the fleet's rate (every host's once a
    period, evenly spread), or with ``seconds`` None one whole period of them as fast as
    possible (a backlog). Returns (reports sent, messages sent, queue lengths sampled about
    every second ``(t, length)``)."""
    import redis

    from controlplane.broker import CONTROL_QUEUE

    r = redis.Redis.from_url(REDIS_URL)
    per_host = len(KINDS)
    slots = len(fleet) if bundled else len(fleet) * per_host
    interval = PERIOD_S / slots
    start = time.monotonic()
    sent, samples, next_sample = 0, [], 0.0
    while True:
        now = time.monotonic() - start
        if seconds is None:
            due = slots
        elif now >= seconds:
            break
        else:
            due = int(now / interval) + 1
        while sent < due:
            send(fleet, sent, bundled=bundled, elapsed=time.time() - started)
            sent += 1
        if seconds is None:
            break
        if now >= next_sample:
            samples.append((round(now, 1), r.llen(CONTROL_QUEUE)))
            next_sample += 1.0
        time.sleep(min(interval, 0.005))
    reports = sent * per_host if bundled else sent
    return reports, sent, samples


KINDS = ("heartbeat", "compute.guests", "network.applied")


def send(fleet: list[dict], n: int, *, bundled: bool, elapsed: float) -> None:
    """The ``n``-th message of the fleet: with ``bundled`` (what agents send) one host's
    heartbeat, guests and network reports in one bundle, else one report alone."""
    from controlplane.agent import reports

    if bundled:
        host = fleet[n % len(fleet)]
        with reports.bundled(host["host"]):
            for kind in KINDS:
                reports.send(host["host"], kind, payload(host, kind, elapsed))
    else:
        host, kind = fleet[n % len(fleet)], KINDS[n // len(fleet) % len(KINDS)]
        reports.send(host["host"], kind, payload(host, kind, elapsed))


def payload(host: dict, kind: str, elapsed: float) -> dict:
    """What the host's agent reports: the heartbeat as recorded, the guests in the power
    and generation recorded (half of them busy, their CPU time growing at one vCPU), the
    network as applied."""
    if kind == "heartbeat":
        return HEARTBEAT
    if kind == "network.applied":
        return {
            "vtep": host["vtep"],
            "underlay_device": "eth0",
            "underlay_mtu": 9000,
            "gateway": False,
            "external_bridge": "",
            "trunk_device": "",
            "sriov_pfs": {},
            "applied_generation": 1,
            "ok": True,
            "error": "",
        }
    busy_ns = int(elapsed * 1e9)
    return {
        "guests": [
            {**g, "cpu_time_ns": busy_ns if i % 2 == 0 else 0} for i, g in enumerate(host["guests"])
        ]
    }


def cpu_s(pids) -> dict[int, float]:
    """CPU seconds each process of ``pids`` has used so far (all its threads)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        used[pid] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return used


def backends() -> list[int]:
    """The PostgreSQL server processes serving the bench's database (on this machine)."""
    import psycopg

    with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [DB_NAME],
        ).fetchall()
    return [pid for (pid,) in rows]


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(used - before.get(pid, 0.0) for pid, used in after.items())


def handled(r) -> list[dict]:
    return [json.loads(x) for x in r.lrange(PROBE_KEY, 0, -1)]


def drain(r, expected: int, workers: list[subprocess.Popen], timeout: float) -> tuple:
    """Wait until the controllers have handled ``expected`` reports (or ``timeout``).
    Returns what they handled, and the CPU seconds the controllers and PostgreSQL's
    processes serving them used between the first message handled and the last."""
    from controlplane.broker import CONTROL_QUEUE

    deadline = time.monotonic() + timeout
    while not r.llen(PROBE_KEY) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [w.pid for w in workers]
    first, db_first = cpu_s(pids), cpu_s(backends())
    while time.monotonic() < deadline:
        done = handled(r)
        if sum(d["n"] for d in done) >= expected and r.llen(CONTROL_QUEUE) == 0:
            break
        time.sleep(0.5)
    return (
        handled(r),
        cpu_delta(first, cpu_s(pids)),
        cpu_delta(db_first, cpu_s(backends())),
    )


def measure(fleet: list[dict], count: int, seconds: float, env: dict, *, bundled: bool) -> dict:
    """Both figures of ``count`` controllers: capacity (draining one period's backlog) and
    keeping up (fed at the fleet's rate)."""
    import redis

    from controlplane.broker import CONTROL_QUEUE

    r = redis.Redis.from_url(REDIS_URL)
    r.flushdb()
    started = T0
    log(f"{count} controller(s): a backlog of one period ({len(fleet)} hosts' reports)")
    backlog, backlog_messages, _ = feed(fleet, None, bundled=bundled, started=started)
    workers = controllers(count, env)
    try:
        done, cpu, db_cpu = drain(r, backlog, workers, timeout=600)
        if any(w.poll() is not None for w in workers):
            raise RuntimeError("a controller exited; see its log in KUMO_VAR_DIR")
        drained = sum(d["n"] for d in done)
        if drained < backlog:
            raise RuntimeError(f"the controllers handled {drained} of {backlog} reports")
        first, last = min(d["done"] for d in done), max(d["done"] for d in done)
        capacity = drained / (last - first)
        r.delete(PROBE_KEY)
        log(f"{count} controller(s): {capacity:.0f} reports/s; feeding for {seconds:.0f} s")
        window_start = time.time()
        sent, messages, samples = feed(fleet, seconds, bundled=bundled, started=started)
        window_end = time.time()
        backlog_end = r.llen(CONTROL_QUEUE)
        done = handled(r)
    finally:
        stop(workers)
        r.flushdb()
    window = window_end - window_start
    in_window = [d for d in done if window_start <= d["done"] <= window_end]
    arrival = sent / window
    messages_per_s = messages / window
    backlog_end_s = backlog_end / messages_per_s
    return {
        "hosts": len(fleet),
        "controllers": count,
        "arrival_per_s": round(arrival, 1),
        "processed_per_s": round(capacity, 1),
        "kept_up_per_s": round(sum(d["n"] for d in in_window) / window, 1),
        "backlog_end": backlog_end,
        "backlog_end_s": round(backlog_end_s, 2),
        "p99_ms": p99_ms([d["latency_s"] for d in in_window]) if in_window else None,
        "bundled": bundled,
        "messages_per_s": round(messages_per_s, 1),
        "backlog_drained": {"reports": backlog, "messages": backlog_messages},
        # CPU per message (a bundle, or one report) draining the backlog: the controllers',
        # PostgreSQL's for them, and the reports/s that would make of 2 cores of their own
        "cpu_ms_per_message": round(cpu / backlog_messages * 1000, 2),
        "db_cpu_ms_per_message": round(db_cpu / backlog_messages * 1000, 2),
        "cpu_bound_per_s": round(2 * drained / (cpu + db_cpu)),
        "queue_samples": samples[:: max(1, len(samples) // 6)],
        "target_met": capacity >= TARGET * arrival and backlog_end_s <= 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--unbundled",
        action="store_true",
        help="each report alone, as agents sent them before bundles (for comparison)",
    )
    args = parser.parse_args()
    wall = time.monotonic()
    with django_on_throwaway_database(DB_NAME, CELERY_BROKER_URL=REDIS_URL):
        import controlplane.celery  # noqa: F401  (the controller's app: reports go to its broker)

        log(f"seeding {args.hosts} hosts with {GUESTS} guests each")
        fleet = seed(args.hosts)
        env = {
            **os.environ,
            "DATABASE_URL": f"{PG_URL}/{DB_NAME}",
            "CELERY_BROKER_URL": REDIS_URL,
            "KUMO_BENCH_REPORTS_REDIS": REDIS_URL,
            "PYTHONPATH": str(ROOT),
        }
        bundled = not args.unbundled
        runs = [measure(fleet, n, args.seconds, env, bundled=bundled) for n in (1, 2)]
    last = runs[-1]
    keys = ("hosts", "controllers", "arrival_per_s", "processed_per_s", "backlog_end", "p99_ms")
    print(
        json.dumps(
            {
                **{k: last[k] for k in keys},
                "target_met": last["target_met"],
                "runs": runs,
                "wall_s": round(time.monotonic() - wall, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
