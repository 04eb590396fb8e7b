"""What every benchmark shares: progress on stderr, a throwaway PostgreSQL database, and
percentiles. Figures go to stdout as one JSON line, last."""

import sys

PG_URL = "postgres://postgres@127.0.0.1:5432"  # trust auth, as on the development machine


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def recreate_database(name: str, *, drop_only: bool = False) -> None:
    """Drop database ``name`` (closing its connections) and, unless ``drop_only``, make it
    anew and empty."""
    import psycopg

    with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if not drop_only:
            conn.execute(f"CREATE DATABASE {name}")


def percentile_ms(seconds: list[float], pct: int) -> float:
    """The ``pct``-th percentile (nearest rank) of ``seconds``, in milliseconds."""
    ordered = sorted(seconds)
    return round(ordered[max(0, -(-len(ordered) * pct // 100) - 1)] * 1000, 2)


def p99_ms(seconds: list[float]) -> float:
    return percentile_ms(seconds, 99)
