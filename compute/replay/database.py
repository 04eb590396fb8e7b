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
