"""API request rates through the full stack, beside a bare Django view served the same way.

Creates a fresh PostgreSQL database ``kumo_bench`` (or ``$KUMO_BENCH_DB``) on 127.0.0.1:5432
(user postgres, trust auth), migrates it, seeds one project with 10,000 audit events and a
token, runs VACUUM ANALYZE as autovacuum would on a real database soon after such a load
(planner statistics, and the visibility map that lets a count read the index alone), and
serves it with gunicorn on a free loopback port, settings ``bench.settings`` (Kumo's own plus
the bare view at ``/bench/bare``). Then it measures, interleaved in rounds so a noisy machine
hurts all three alike, with token auth on every request:

- list:   ``GET /api/v1/projects/<slug>/audit-events/?page_size=100`` (page 1 of 100)
- detail: ``GET /api/v1/projects/<slug>/audit-events/<id>/`` (cycling over 1,000 ids)
- bare:   ``GET /bench/bare``, a small JsonResponse behind the same middleware

and counts in-process (django.test.Client) the SQL queries of a list request at page_size 10
and 100, which should be equal. The database's connection health check (``SELECT 1`` when a
persistent connection is reused) is not counted: it bypasses Django's query log.

Prints progress on stderr and one JSON line on stdout: ``list_rps``, ``detail_rps``,
``bare_rps``, p99 latencies in ms, the ratios to bare, the query counts, the targets
(``list_target``: a list page at least 0.25 of bare's rate; ``detail_target``: a detail at
least 0.5) and whether each was met (``list_target_met``, ``detail_target_met``, and
``targets_met`` for both); it exits with status 1 when a target is missed. Gunicorn and the
load generator share the machine's cores, so compare figures from the same run; the ratios are
the portable part. Stops gunicorn and drops the database at the end, whatever happens.

Run: ``make bench-api`` or ``.venv/bin/python bench/api.py`` (about 30 s).
"""

import http.client
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make `bench` and the apps importable

from bench.common import (  # noqa: E402
    PG_URL,
    log,
    p99_ms,
    recreate_database,
    terminated_as_interrupted,
)

DB_NAME = os.environ.get("KUMO_BENCH_DB", "kumo_bench")  # another name: benches side by side
OBJECTS = 10_000
PAGE_SIZE = 100
# Two sync workers, as `manage.py run` and deploy/ serve Kumo: one process per core, each
# request CPU-bound in Python, so threads would only contend for the GIL. Sync workers close
# the connection after each response; http.client reconnects, as the reverse proxy in
# front of them does. Four client threads keep both workers busy while replies are read.
WORKERS = 2
CONCURRENCY = 4
WARMUP_S = 1.0
ROUNDS = 3
SLICE_S = 2.0  # per endpoint and round: ROUNDS * SLICE_S seconds measured per endpoint
SLICE_MAX_REQUESTS = 20_000  # the other bound of a slice, should the machine be very fast
# The targets, as ratios of each endpoint's rate to bare's measured in the same run.
LIST_TARGET = 0.25
DETAIL_TARGET = 0.5


def seed() -> tuple[str, str, list[int]]:
    """One user owning one project with OBJECTS audit events; returns the project's slug, a
    token secret and the events' ids."""
    from django.db import connection

    from controlplane.choices import AuditOutcome, AuditSource
    from controlplane.models import AuditEvent
    from tenants import services

    user = services.user_create(username="bench")
    project = services.project_create(slug="bench", name="Bench", owner=user)
    _, secret = services.token_create(user=user, name="bench")
    missing = OBJECTS - AuditEvent.objects.filter(project=project).count()  # services audit
    events = AuditEvent.objects.bulk_create(
        (
            AuditEvent(
                actor=user,
                actor_name=user.username,
                source=AuditSource.API,
                action="instance.update",
                object_type="compute.instance",
                object_id=str(i),
                object_repr=f"vm-{i:05d}",
                project=project,
                project_slug=project.slug,
                ip_address="127.0.0.1",
                outcome=AuditOutcome.SUCCESS,
                detail={"changed": ["name"], "n": i},
            )
            for i in range(missing)
        ),
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        # Planner statistics and the visibility map, as autovacuum would soon make them (the
        # map lets PostgreSQL count a list from its index alone).
        cursor.execute("VACUUM ANALYZE")
    return project.slug, secret, [event.pk for event in events]


def list_queries(url: str, secret: str) -> dict[str, int]:
    """SQL queries of one list request at page_size 10 and 100, counted in-process."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(headers={"authorization": f"Bearer {secret}"})
    client.get(url)  # the token's first use records it (one write a minute): not counted
    counts = {}
    for size in (10, PAGE_SIZE):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url, {"page_size": size})
        body = response.json()
        if response.status_code != 200 or body["count"] != OBJECTS:
            raise RuntimeError(f"list answered {response.status_code}: {body}")
        counts[f"page_size_{size}"] = len(queries)
    return counts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gunicorn(env: dict[str, str], log_path: Path):
    """Serve bench.settings on a free loopback port; yields the port, stops the group after."""
    port = free_port()
    argv = [
        sys.executable, "-m", "gunicorn", "controlplane.wsgi:application",
        "--bind", f"127.0.0.1:{port}", "--workers", str(WORKERS), "--worker-class", "sync",
        "--chdir", str(ROOT), "--log-level", "warning",
    ]  # fmt: skip
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start:\n{log_path.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/bench/bare")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
            finally:
                conn.close()
        yield port
    finally:
        with suppress(ProcessLookupError):  # the group is gone if gunicorn failed to start
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def load(port: int, paths: list[str], headers: dict, seconds: float) -> tuple[float, list]:
    """CONCURRENCY threads GET ``paths`` in turn until ``seconds`` have passed or
    SLICE_MAX_REQUESTS were sent; returns the elapsed time and every request's latency (s).
    Raises on any error or non-200 answer."""
    budget = itertools.count()
    results: list[list[float]] = []
    errors: list[str] = []

    def client(offset: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        latencies = []
        try:
            for path in itertools.islice(itertools.cycle(paths), offset, None):
                if time.perf_counter() >= deadline or next(budget) >= SLICE_MAX_REQUESTS:
                    break
                start = time.perf_counter()
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                latencies.append(time.perf_counter() - start)
                if response.status != 200:
                    errors.append(f"{path}: {response.status}")
                    break
        except (OSError, http.client.HTTPException) as e:
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            conn.close()
            results.append(latencies)

    threads = [threading.Thread(target=client, args=(i * 7,)) for i in range(CONCURRENCY)]
    start = time.perf_counter()
    deadline = start + seconds
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"load on {paths[0]}: {errors[:3]}")
    return time.perf_counter() - start, [latency for r in results for latency in r]


def measure(port: int, targets: dict[str, list[str]], headers: dict) -> dict:
    for paths in targets.values():
        load(port, paths, headers, WARMUP_S)
    elapsed = dict.fromkeys(targets, 0.0)
    latencies: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    for round_ in range(ROUNDS):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            seconds, lat = load(port, targets[name], headers, SLICE_S)
            elapsed[name] += seconds
            latencies[name] += lat
    result = {f"{n}_rps": round(len(latencies[n]) / elapsed[n], 1) for n in names}
    result |= {f"{n}_p99_ms": p99_ms(latencies[n]) for n in names}
    result |= {f"{n}_requests": len(latencies[n]) for n in names}
    return result


def main() -> None:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kumo-bench-") as var_dir:
        for name in ("PROMETHEUS_MULTIPROC_DIR", "GUNICORN_CMD_ARGS", "WEB_CONCURRENCY"):
            os.environ.pop(name, None)  # nothing from the caller's shell changes the setup
        os.environ.update(
            DJANGO_SETTINGS_MODULE="bench.settings",
            DATABASE_URL=f"{PG_URL}/{DB_NAME}",
            KUMO_VAR_DIR=var_dir,
            DEBUG="0",
        )
        recreate_database(DB_NAME)
        try:
            import django
            from django.core.management import call_command
            from django.db import connections

            django.setup()
            log("migrating")
            call_command("migrate", interactive=False, verbosity=0)
            log(f"seeding {OBJECTS} audit events")
            slug, secret, ids = seed()
            base = f"/api/v1/projects/{slug}/audit-events/"
            queries = list_queries(base, secret)
            connections.close_all()

            headers = {"Authorization": f"Bearer {secret}", "Accept": "application/json"}
            targets = {
                "list": [f"{base}?page_size={PAGE_SIZE}"],
                "detail": [f"{base}{pk}/" for pk in ids[::10]],
                "bare": ["/bench/bare"],
            }
            with gunicorn(dict(os.environ), Path(var_dir) / "gunicorn.log") as port:
                log(f"measuring on 127.0.0.1:{port}, {ROUNDS}x{SLICE_S:g} s per endpoint")
                result = measure(port, targets, headers)
        finally:
            recreate_database(DB_NAME, drop_only=True)  # WITH (FORCE): also ends our own connection
    list_vs_bare = result["list_rps"] / result["bare_rps"]
    detail_vs_bare = result["detail_rps"] / result["bare_rps"]
    result |= {
        "list_vs_bare": round(list_vs_bare, 3),
        "detail_vs_bare": round(detail_vs_bare, 3),
        "list_target": LIST_TARGET,
        "detail_target": DETAIL_TARGET,
        "list_target_met": list_vs_bare >= LIST_TARGET,
        "detail_target_met": detail_vs_bare >= DETAIL_TARGET,
        "targets_met": list_vs_bare >= LIST_TARGET and detail_vs_bare >= DETAIL_TARGET,
        "list_queries": queries,
        "objects": OBJECTS,
        "page_size": PAGE_SIZE,
        "workers": WORKERS,
        "concurrency": CONCURRENCY,
        "wall_s": round(time.monotonic() - began, 1),
    }
    print(json.dumps(result))
    if not result["targets_met"]:
        log(
            f"target missed: list {list_vs_bare:.3f} (>= {LIST_TARGET}), "
            f"detail {detail_vs_bare:.3f} (>= {DETAIL_TARGET}) of bare"
        )
        sys.exit(1)


if __name__ == "__main__":
    with terminated_as_interrupted():  # a SIGTERM still drops the database
        main()
