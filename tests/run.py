#!/usr/bin/env python
"""`make test`: find PostgreSQL and Redis, say what runs where and what is skipped, run pytest.

- DATABASE_URL set: used as is. Unset: PostgreSQL on 127.0.0.1:5432 (user postgres) when it
  answers, else the embedded SQLite default, and the PostgreSQL-only tests skip with the reason.
- KUMO_TEST_REDIS_URL set: used. Unset: redis://127.0.0.1:6379/15 when it answers; the
  Redis broker tests skip otherwise. The embedded filesystem broker is always tested.
- In CI (CI=true) a missing PostgreSQL or Redis is an error, not a skip: CI must test the
  production stack.
- When the main run used PostgreSQL, a second, short run checks the embedded defaults that
  `make run` uses: the tests marked ``embedded`` or ``e2e`` on SQLite and the filesystem broker.
  It runs beside the main pass, after the real-guest test (which mostly waits for a guest
  under TCG on one core), and its output follows the main pass's.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def main() -> int:
    env = dict(os.environ)
    in_ci = env.get("CI", "").lower() in ("1", "true", "yes")
    notes, missing = [], []

    if not env.get("DATABASE_URL"):
        if answers("127.0.0.1", 5432):
            env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/kumo"
        else:
            missing.append("PostgreSQL (nothing answers on 127.0.0.1:5432)")
    db = env.get("DATABASE_URL", "sqlite (embedded default)")
    notes.append(f"database: {db.split('@')[-1] if '@' in db else db}")

    if not env.get("KUMO_TEST_REDIS_URL"):
        if answers("127.0.0.1", 6379):
            env["KUMO_TEST_REDIS_URL"] = "redis://127.0.0.1:6379/15"
        else:
            missing.append("Redis (nothing answers on 127.0.0.1:6379)")
    notes.append(f"redis broker tests: {env.get('KUMO_TEST_REDIS_URL', 'skipped')}")

    # The suite's own state (SQLite file, broker folders, secret) lives in a throwaway folder.
    env.setdefault("KUMO_VAR_DIR", tempfile.mkdtemp(prefix="kumo-test-"))
    env.setdefault("DATABASE_TEST_NAME", "test_kumo")

    print("kumo test run: " + "; ".join(notes), flush=True)
    for item in missing:
        print(f"  not available, its tests are skipped: {item}", flush=True)
    if missing and in_ci:
        print("CI must run on PostgreSQL and Redis: failing.", file=sys.stderr)
        return 2

    cmd = [sys.executable, "-m", "pytest", *sys.argv[1:]]
    if sys.argv[1:] or not env.get("DATABASE_URL", "").startswith("postgres"):
        return subprocess.call(cmd, cwd=ROOT, env=env)

    # The whole suite on PostgreSQL. The real-guest test spends minutes waiting for a guest
    # under QEMU's TCG, mostly on one core: it runs beside the main pass, on its own test
    # database, followed by the embedded pass; their output follows the main pass's.
    side_log = Path(env["KUMO_VAR_DIR"]) / "side-chain.log"
    with side_log.open("w") as out:
        side = subprocess.Popen(
            [sys.executable, "-c", SIDE_CHAIN, json.dumps(env)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        status = subprocess.call([*cmd, "-m", "not real_guest"], cwd=ROOT, env=env)
        side_status = side.wait()
    print("\nkumo test run: the real guest, then the embedded defaults", flush=True)
    sys.stdout.write(side_log.read_text())

    def said(code: int) -> str:
        return "passed" if code == 0 else f"FAILED ({code})"

    print(
        f"\nkumo test run: main pass {said(status)}; "
        f"real guest and embedded pass {said(side_status)}",
        flush=True,
    )
    return status or side_status


def side_chain(env: dict) -> int:
    """The real-guest test on its own test database, then the tests marked ``embedded`` or
    ``e2e`` on SQLite and the filesystem broker (what ``make run`` uses)."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    guest = {**env, "DATABASE_TEST_NAME": env["DATABASE_TEST_NAME"] + "_guest"}
    guest["KUMO_VAR_DIR"] = tempfile.mkdtemp(prefix="kumo-test-guest-")
    print("kumo test run: the real guest (PostgreSQL)", flush=True)
    status = subprocess.call([*pytest, "-m", "real_guest"], cwd=ROOT, env=guest)

    print("\nkumo test run: embedded defaults (SQLite, filesystem broker)", flush=True)
    embedded = dict(env)
    embedded["KUMO_VAR_DIR"] = tempfile.mkdtemp(prefix="kumo-test-embedded-")
    embedded["DATABASE_URL"] = f"sqlite:///{embedded['KUMO_VAR_DIR']}/kumo.sqlite3"
    embedded.pop("KUMO_TEST_REDIS_URL", None)
    embedded_status = subprocess.call([*pytest, "-m", "embedded or e2e"], cwd=ROOT, env=embedded)
    return status or embedded_status


SIDE_CHAIN = (
    "import json, sys; sys.path.insert(0, 'tests'); import run; "
    "sys.exit(run.side_chain(json.loads(sys.argv[1])))"
)


if __name__ == "__main__":
    sys.exit(main())
