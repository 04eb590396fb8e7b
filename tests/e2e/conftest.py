"""The real-process fixture: a fleet of Kumo processes on a real broker (the embedded
filesystem one, and Redis where it runs), sharing the test database."""

import os

import pytest

from tests.e2e.processes import Fleet, database_url

REDIS_URL = os.environ.get("KUMO_TEST_REDIS_URL")
#: Set by tests/run.py on the main pass of a PostgreSQL run: its embedded pass runs these
#: tests on the filesystem broker (with SQLite, as ``make run`` does), so the main pass runs
#: them on Redis, the production broker, only.
FILESYSTEM_ELSEWHERE = os.environ.get("KUMO_TEST_FILESYSTEM_BROKER_ELSEWHERE") == "1"
BROKERS = [
    pytest.param(
        "filesystem://",
        id="filesystem",
        marks=pytest.mark.skipif(
            FILESYSTEM_ELSEWHERE, reason="the filesystem broker's run is the embedded pass's"
        ),
    ),
    pytest.param(
        REDIS_URL,
        id="redis",
        marks=pytest.mark.skipif(not REDIS_URL, reason="no Redis: KUMO_TEST_REDIS_URL unset"),
    ),
]


@pytest.fixture(params=BROKERS)
def fleet(request, tmp_path, settings):
    broker = request.param
    if broker and broker.startswith("redis"):
        import redis

        redis.Redis.from_url(broker).flushdb()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=broker,
        KUMO_VAR_DIR=str(tmp_path),
        KUMO_HEARTBEAT_INTERVAL_S="1",
        KUMO_GUESTS_REPORT_INTERVAL_S="2",
        KUMO_RECONCILE_GRACE_S="1",
        DATABASE_TEST_NAME="",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    fleet = Fleet(env, tmp_path)
    yield fleet
    fleet.stop()
