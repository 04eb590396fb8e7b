"""A throwaway database for a replay: never the one Kumo runs on."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager

#: Migrated databases kept for the process's next throwaway one, by server: a database name
#: on PostgreSQL (cloned with ``CREATE DATABASE … TEMPLATE``), a file on SQLite (copied).
_TEMPLATES: dict[tuple, str] = {}


@contextmanager
def throwaway_database(*, reuse_migrations: bool = False):
    """Point Django's default connection at a new, migrated, empty database for the block,
    and drop it afterwards whatever happens: on PostgreSQL a new database on the same
    server (``kumo_replay_<random>``, whose commits do not wait for the disk: nothing in it
    outlives the replay), on SQLite a temporary file.

    ``reuse_migrations``: for a process that replays more than once (the test suite, a
    bench). The first database is migrated as a template kept until the process exits, and
    each one is a copy of it: seconds of migrations, paid once."""
    from django.db import connections

    settings = connections.databases["default"]
    before = dict(settings)
    connections["default"].close()
    vendor = connections["default"].vendor
    name = f"kumo_replay_{uuid.uuid4().hex[:10]}"
    template = _template(before, vendor) if reuse_migrations else None
    tmp = None
    if vendor == "postgresql":
        _admin(before, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        # Thrown away at the end: a commit need not wait for its WAL to reach the disk.
        _admin(before, f"ALTER DATABASE {name} SET synchronous_commit = off")
        settings["NAME"] = name
    else:
        fd, tmp = tempfile.mkstemp(prefix="kumo-replay-", suffix=".sqlite3")
        os.close(fd)
        if template:
            shutil.copyfile(template, tmp)
        settings["NAME"] = tmp
    connections["default"].settings_dict.update(settings)
    try:
        if not template:
            _migrate()
        yield name if tmp is None else tmp
    finally:
        _restore(before)
        if tmp is None:
            _admin(before, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        else:
            os.unlink(tmp)


def _migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _restore(before: dict) -> None:
    from django.db import connections

    connections["default"].close()
    connections["default"].settings_dict.update(before)
    connections.databases["default"].update(before)


def _template(before: dict, vendor: str) -> str:
    """The process's migrated template for the server of ``before``, made on first use and
    removed when the process exits."""
    from django.db import connections

    key = (vendor, before.get("HOST"), before.get("PORT"), before.get("NAME"))
    if key in _TEMPLATES:
        return _TEMPLATES[key]
    settings = connections.databases["default"]
    if vendor == "postgresql":
        template = f"kumo_replay_template_{uuid.uuid4().hex[:10]}"
        _admin(before, f"CREATE DATABASE {template}")
        atexit.register(_admin, before, f"DROP DATABASE IF EXISTS {template} WITH (FORCE)")
    else:
        fd, template = tempfile.mkstemp(prefix="kumo-replay-template-", suffix=".sqlite3")
        os.close(fd)
        atexit.register(lambda: os.path.exists(template) and os.unlink(template))
    settings["NAME"] = template
    connections["default"].settings_dict.update(settings)
    try:
        _migrate()
    finally:
        _restore(before)  # no session left on the template: it can be copied
    _TEMPLATES[key] = template
    return template


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
