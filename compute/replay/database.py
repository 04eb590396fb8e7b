"""A throwaway database for a replay: never the one Kumo runs on."""

from __future__ import annotations

import os
import tempfile
import uuid
from contextlib import contextmanager


@contextmanager
def throwaway_database():
    """Point Django's default connection at a new, migrated, empty database for the block,
    and drop it afterwards whatever happens: on PostgreSQL a new database on the same
    server (``kumo_replay_<random>``, whose commits do not wait for the disk: nothing in it
    outlives the replay), on SQLite a temporary file."""
    from django.core.management import call_command
    from django.db import connections

    settings = connections.databases["default"]
    before = dict(settings)
    connections["default"].close()
    vendor = connections["default"].vendor
    tmp = None
    name = f"kumo_replay_{uuid.uuid4().hex[:10]}"
    if vendor == "postgresql":
        _admin(before, f"CREATE DATABASE {name}")
        # Thrown away at the end: a commit need not wait for its WAL to reach the disk.
        _admin(before, f"ALTER DATABASE {name} SET synchronous_commit = off")
        settings["NAME"] = name
    else:
        fd, tmp = tempfile.mkstemp(prefix="kumo-replay-", suffix=".sqlite3")
        os.close(fd)
        settings["NAME"] = tmp
    connections["default"].settings_dict.update(settings)
    try:
        call_command("migrate", interactive=False, verbosity=0)
        yield name if tmp is None else tmp
    finally:
        connections["default"].close()
        connections["default"].settings_dict.update(before)
        settings.update(before)
        if tmp is None:
            _admin(before, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        else:
            os.unlink(tmp)


def _admin(settings: dict, sql: str) -> None:
    import psycopg

    conn = psycopg.connect(
        dbname="postgres",
        user=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        host=settings.get("HOST") or None,
        port=settings.get("PORT") or None,
        autocommit=True,
    )
    try:
        conn.execute(sql)
    finally:
        conn.close()


# The tables autovacuum would take now: its own thresholds, read from the server's settings.
_DUE = """
SELECT relname FROM pg_stat_user_tables
WHERE n_dead_tup > current_setting('autovacuum_vacuum_threshold')::int
                   + current_setting('autovacuum_vacuum_scale_factor')::float * n_live_tup
   OR n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::int
                   + current_setting('autovacuum_analyze_scale_factor')::float * n_live_tup
ORDER BY relname
"""


def vacuum_as_autovacuum_would() -> list[str]:
    """On PostgreSQL, ``VACUUM (ANALYZE)`` each table of the connection's database that
    autovacuum would take now (dead row versions, or rows changed since the last analyze,
    past its thresholds); returns their names. A replay runs days in minutes, faster than
    autovacuum wakes (a minute apart), and the server's may be off (it is on Kumo's CI
    machine): without this, the dead versions of the rows every pass reads pile up (a
    month's queue of spot VMs is rewritten with every placement) and each pass slows, and
    the planner plans for the empty tables the replay began with. On SQLite,
    ``PRAGMA optimize``, which SQLite asks a long-lived connection to run now and then: it
    analyzes the tables whose statistics are missing or stale, without which SQLite takes
    the index on a VM's state over the scheduling queue's partial indexes.

    The counts it reads are this connection's, all of them up to now: a backend publishes
    its counts when idle at least a second of wall time after the last time, so without
    the forced flush the tables found due, and so the physical order of rows that a later
    query without a full ``ORDER BY`` returns, would follow the machine's speed instead of
    the replay's events. Call it outside a transaction (the flush waits for one to end)."""
    from django.db import connection

    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA optimize")
        return []
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # flushed before the next one
        cursor.execute(_DUE)
        tables = [name for (name,) in cursor.fetchall()]
        for name in tables:
            cursor.execute(f"VACUUM (ANALYZE) {connection.ops.quote_name(name)}")
    return tables
