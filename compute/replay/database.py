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

    ``reuse_migrations``: for a process that replays more than once (the test suite). The
    first database is migrated as a template kept until the process exits, and each one is
    a copy of it: seconds of migrations, paid once."""
    from django.db import connections

    before = dict(connections.databases["default"])
    connections["default"].close()
    vendor = connections["default"].vendor
    template = _template(before, vendor) if reuse_migrations else None
    name = _create(before, vendor, template=template)
    _point_at(name)
    try:
        if template is None:
            _migrate()
        yield name
    finally:
        connections["default"].close()
        _point_at(before["NAME"])
        _drop(before, vendor, name)


def _create(before: dict, vendor: str, *, template: str | None = None) -> str:
    """A new database beside the one of ``before``, empty or a copy of ``template``: its
    name on PostgreSQL, its file on SQLite."""
    if vendor == "postgresql":
        name = f"kumo_replay_{uuid.uuid4().hex[:10]}"
        _admin(before, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        # Thrown away at the end: a commit need not wait for its WAL to reach the disk.
        _admin(before, f"ALTER DATABASE {name} SET synchronous_commit = off")
        return name
    fd, name = tempfile.mkstemp(prefix="kumo-replay-", suffix=".sqlite3")
    os.close(fd)
    if template:
        shutil.copyfile(template, name)
    return name


def _drop(before: dict, vendor: str, name: str) -> None:
    if vendor == "postgresql":
        _admin(before, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    elif os.path.exists(name):
        os.unlink(name)


def _point_at(name: str) -> None:
    """Django's default connection (closed) now opens database ``name``."""
    from django.db import connections

    connections.databases["default"]["NAME"] = name
    connections["default"].settings_dict["NAME"] = name


def _migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _template(before: dict, vendor: str) -> str:
    """The process's migrated template for the server of ``before``, made on first use and
    dropped when the process exits."""
    from django.db import connections

    key = (vendor, before.get("HOST"), before.get("PORT"), before.get("NAME"))
    if key not in _TEMPLATES:
        template = _create(before, vendor)
        atexit.register(_drop, before, vendor, template)
        _point_at(template)
        try:
            _migrate()
        finally:
            connections["default"].close()  # no session left on the template: it can be copied
            _point_at(before["NAME"])
        _TEMPLATES[key] = template
    return _TEMPLATES[key]


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
