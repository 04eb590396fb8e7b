"""Billing at scale: 1,000,000 usage intervals rated into invoices on PostgreSQL.

Creates a fresh PostgreSQL database ``kumo_bench_billing`` on 127.0.0.1:5432 (user postgres,
trust auth), migrates it and seeds, in SQL (untimed), PROJECTS projects (200; set
KUMO_BENCH_PROJECTS for more) and RECORDS usage intervals spread over them: vCPUs, memory,
GPUs of two models, storage and global IPs, on demand, spot and reserved, starting up to a
month before September 2026 or inside it, a tenth still open, the rest ending inside or
after it; and three rate card versions, one starting in the middle of the month, so the
intervals running across it (about half) are split at the price change. Then, RUNS times
each, alternating, every run in a transaction rolled back afterwards so each starts equal:

1. Kumo: ``tenants.billing.invoices_issue`` for the month: the one aggregate query that
   clips every interval to the month, splits it at the rate cards' boundaries and sums
   quantity x seconds per project, resource, model, priority and card; then the Decimal
   pricing and rounding, the canonical JSON and its hash, and the invoices and their audit
   events written, one per project;
2. the reference: a plain ``SELECT … SUM(quantity * seconds) … GROUP BY`` over the same rows
   (clipped to the month, no rate cards, nothing priced, nothing written).

Checks, untimed: the seconds Kumo rated, summed over rate cards, equal the plain query's
for every (project, resource, model, priority); an issued invoice recomputes to identical
bytes. Prints progress on stderr and one JSON line, last, on stdout: ``records``,
``records_per_s`` (Kumo, median run), ``sql_groupby_records_per_s`` (the reference, median
run), their ratio (target: at least 0.5), invoices made, and the checks. Drops the
database at the end, whatever happens.

Run: ``make bench-billing`` or ``.venv/bin/python bench/billing.py`` (about a minute).
"""

import json
import os
import statistics
import sys
import time
from datetime import UTC, date, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make the apps importable

from bench.common import django_on_throwaway_database, log  # noqa: E402

DB_NAME = "kumo_bench_billing"
# A few hundred projects, as a university research cloud has (mdx: about 200 a year); each
# invoice costs a fixed ~0.6 ms of pricing and writing beside the rating, so with many more
# projects (KUMO_BENCH_PROJECTS=1000) the records/s figure falls by that much.
PROJECTS = int(os.environ.get("KUMO_BENCH_PROJECTS", "200"))
RECORDS = 1_000_000
RUNS = 3
PERIOD = date(2026, 9, 1)
START = datetime(2026, 9, 1, tzinfo=UTC)
END = datetime(2026, 10, 1, tzinfo=UTC)

# Intervals: a resource by row number, a start up to 30 days before the month's start or in
# it, a length up to 40 days, one in ten open. setseed makes the rows the same every run.
SEED_SQL = """
SELECT setseed(0.42);
INSERT INTO tenants_usagerecord
    (project_id, subject_type, subject_id, subject_name, resource, model, priority,
     quantity, started_at, ended_at)
SELECT p.id, 'bench.subject', s.g::text, '',
       (ARRAY['vcpu','memory','gpu','gpu','storage','global_ip'])[1 + s.g % 6],
       CASE s.g % 6 WHEN 2 THEN 'A100-SXM4-40GB' WHEN 3 THEN 'H100-SXM5-80GB' ELSE '' END,
       (ARRAY['on_demand','on_demand','spot','reserved'])[1 + (s.g / 6) % 4],
       CASE s.g % 6 WHEN 1 THEN round((1 + s.r1 * 512)::numeric, 4)
                    WHEN 4 THEN (10 + floor(s.r1 * 2000))::numeric
                    ELSE (1 + floor(s.r1 * 16))::numeric END,
       s.started_at,
       CASE WHEN s.g % 10 = 0 THEN NULL ELSE s.started_at + s.r2 * interval '40 days' END
FROM (SELECT g, random() AS r1, random() AS r2,
             TIMESTAMPTZ '{start}' - interval '30 days' + random() * interval '59 days'
                 AS started_at
      FROM generate_series(1, {records}) AS g) s
JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM tenants_project) p
  ON p.n = s.g % {projects};
"""

# The rate card versions: one valid since January, a price change in the middle of the
# month (every interval running across it is split in two), and the next version after it.
RATE_CHANGES = [
    datetime(2026, 1, 1, tzinfo=UTC),
    datetime(2026, 9, 16, 12, 30, tzinfo=UTC),
    datetime(2026, 10, 1, tzinfo=UTC),
]

PLAIN_SQL = """
SELECT project_id, resource, model, priority,
       SUM(quantity * EXTRACT(EPOCH FROM
           LEAST(COALESCE(ended_at, %(end)s), %(end)s) - GREATEST(started_at, %(start)s)))
FROM tenants_usagerecord
WHERE started_at < %(end)s AND (ended_at IS NULL OR ended_at > %(start)s)
GROUP BY project_id, resource, model, priority
"""


def seed() -> None:
    from django.db import connection

    from tenants import billing
    from tenants.models import User

    owner = User.objects.create(username="bench")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tenants_project (slug, name, description, owner_id, status, "
            "created_at, updated_at) SELECT 'bench-' || g, 'Bench ' || g, '', %s, 'active', "
            "now(), now() FROM generate_series(1, %s) g",
            [owner.pk, PROJECTS],
        )
        for statement in SEED_SQL.format(
            start=START.isoformat(), records=RECORDS, projects=PROJECTS
        ).split(";"):
            if statement.strip():
                cursor.execute(statement)
    base = [
        {"resource": "vcpu", "unit_price": "4.5"},
        {"resource": "memory", "unit_price": "0.6"},
        {"resource": "gpu", "unit_price": "250"},
        {"resource": "gpu", "model": "A100-SXM4-40GB", "unit_price": "310"},
        {"resource": "gpu", "model": "H100-SXM5-80GB", "unit_price": "620"},
        {"resource": "storage", "unit_price": "9.125"},
        {"resource": "global_ip", "unit_price": "1.2"},
    ]
    for n, starts in enumerate(RATE_CHANGES, start=1):
        prices = [{**p, "unit_price": str(float(p["unit_price"]) * (1 + n / 10))} for p in base]
        billing.rate_card_create(valid_from=starts, prices=prices)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE tenants_usagerecord")


def timed_kumo() -> tuple[float, int]:
    from django.db import transaction

    from tenants import billing

    with transaction.atomic():
        t0 = time.perf_counter()
        made = billing.invoices_issue(period=PERIOD)
        elapsed = time.perf_counter() - t0
        transaction.set_rollback(True)
    return elapsed, len(made)


def timed_plain() -> tuple[float, list]:
    from django.db import connection, transaction

    with transaction.atomic():
        t0 = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(PLAIN_SQL, {"start": START, "end": END})
            rows = cursor.fetchall()
        elapsed = time.perf_counter() - t0
        transaction.set_rollback(True)
    return elapsed, rows


def checks(plain_rows) -> dict:
    from collections import defaultdict
    from decimal import Decimal

    from tenants import billing
    from tenants.models import Invoice

    rated = billing.usage_seconds(START, END)
    summed: dict = defaultdict(Decimal)
    for project_id, sums in rated.items():
        for (resource, model, priority, _card), qsec in sums.items():
            summed[(project_id, resource, model, priority)] += qsec
    plain = {(p, r, m, pr): Decimal(q) for p, r, m, pr, q in plain_rows if q}
    made = billing.invoices_issue(period=PERIOD)
    sample = Invoice.objects.select_related("project").get(pk=made[len(made) // 2].pk)
    splits = sum(len({k[3] for k in sums}) > 1 for sums in rated.values())
    return {
        "seconds_match": dict(summed) == plain,
        "recompute_identical": billing.invoice_verify(sample)["identical"],
        "projects_split_by_rate_change": splits,
    }


def main() -> None:
    began = time.monotonic()
    with django_on_throwaway_database(DB_NAME):
        log(f"seeding {PROJECTS} projects and {RECORDS} usage intervals")
        t0 = time.perf_counter()
        seed()
        log(f"seeded in {time.perf_counter() - t0:.1f} s")
        kumo, plain = [], []
        timed_plain()  # warm the cache: both runs read the table from memory
        for run in range(RUNS):
            seconds, invoices = timed_kumo()
            kumo.append(seconds)
            seconds, rows = timed_plain()
            plain.append(seconds)
            log(f"run {run + 1}: kumo {kumo[-1]:.2f} s ({invoices} invoices), "
                f"plain GROUP BY {plain[-1]:.2f} s")  # fmt: skip
        log("checking")
        result_checks = checks(rows)
    kumo_s, plain_s = statistics.median(kumo), statistics.median(plain)
    result = {
        "records": RECORDS,
        "projects": PROJECTS,
        "invoices": invoices,
        "kumo_s": round(kumo_s, 3),
        "sql_groupby_s": round(plain_s, 3),
        "vs_sql_groupby": round(plain_s / kumo_s, 3),
        "checks": result_checks,
        "wall_s": round(time.monotonic() - began, 1),
        "records_per_s": round(RECORDS / kumo_s),
        "sql_groupby_records_per_s": round(RECORDS / plain_s),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
