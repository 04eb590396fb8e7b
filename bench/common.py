"""What every benchmark shares: progress on stderr, a throwaway PostgreSQL database, and
percentiles. Figures go to stdout as one JSON line, last."""

import os
import sys
import tempfile
from contextlib import contextmanager

from controlplane.supervise import terminated_as_interrupted  # the benches' too

PG_URL = "postgres://postgres@127.0.0.1:5432"  # trust auth, as on the development machine


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def recreate_database(name: str, *, drop_only: bool = False, durable: bool = True) -> None:
    """Drop database ``name`` (closing its connections) and, unless ``drop_only``, make it
    anew and empty. Not ``durable``: its commits do not wait for the disk (for a bench
    whose figures are not about commits, on a database nothing outlives)."""
    import psycopg

    with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if not drop_only:
            conn.execute(f"CREATE DATABASE {name}")
            if not durable:
                conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")


def percentile_ms(seconds: list[float], pct: int) -> float:
    """The ``pct``-th percentile (nearest rank) of ``seconds``, in milliseconds."""
    ordered = sorted(seconds)
    return round(ordered[max(0, -(-len(ordered) * pct // 100) - 1)] * 1000, 2)


def p99_ms(seconds: list[float]) -> float:
    return percentile_ms(seconds, 99)


@contextmanager
def django_on_throwaway_database(name: str, *, durable: bool = True, **env: str):
    """Django set up on a fresh PostgreSQL database ``name`` (see ``recreate_database`` for
    ``durable``), migrated, with a throwaway ``KUMO_VAR_DIR`` and ``env`` as more settings;
    the database is dropped afterwards, whatever happens (a SIGTERM included)."""
    with terminated_as_interrupted(), tempfile.TemporaryDirectory(prefix="kumo-bench-") as var_dir:
        os.environ.update(
            DJANGO_SETTINGS_MODULE="controlplane.settings",
            DATABASE_URL=f"{PG_URL}/{name}",
            KUMO_VAR_DIR=var_dir,
            KUMO_LOG_LEVEL="WARNING",
            DEBUG="0",
            **env,
        )
        recreate_database(name, durable=durable)
        try:
            import django
            from django.core.management import call_command

            django.setup()
            log("migrating")
            call_command("migrate", interactive=False, verbosity=0)
            yield
        finally:
            from django.db import connections

            connections.close_all()
            recreate_database(name, drop_only=True)
