#!/usr/bin/env python
"""`make test`: find PostgreSQL and Redis, say what runs where and what is skipped, run pytest.

- DATABASE_URL set: used as is. Unset: PostgreSQL on 127.0.0.1:5432 (user postgres) when it
  answers, else the embedded SQLite default, and the PostgreSQL-only tests skip with the reason.
- KUMO_TEST_REDIS_URL set: used. Unset: redis://127.0.0.1:6379/15 when it answers; the
  Redis broker tests skip otherwise. The embedded filesystem broker is always tested.
- In CI (CI=true) a missing PostgreSQL or Redis is an error, not a skip: CI must test the
  production stack.
- On PostgreSQL, the longest modules that reach nothing outside their own process and test
  database (the API fuzz, the list query counts, the demand replay: ``BESIDE``) run in a pass
  of their own beside the main pass, on their own test database and folder, so that the
  main pass, the run's longest, no longer carries their time. That pass waits on no clock,
  so it runs at the lowest CPU priority (``BESIDE_NICE``): it takes the time the other two
  leave, and the real guests under TCG (whose test waits on boots and notices against the
  clock) see no more contention than beside the main pass alone.
- When the main run used PostgreSQL, a second, short run checks the embedded defaults that
  `make run` uses: the tests marked ``embedded`` or ``e2e`` on SQLite and the filesystem broker.
  The main pass then runs the real-process tests on Redis only (their filesystem broker run
  is this one's: PostgreSQL with the filesystem broker is neither production nor `make run`).
  It runs beside the main pass, after the real-guest test (which mostly waits for a guest
  under TCG on one core), and its output follows the main pass's.
- The run ends with a recap of every failing test of every pass: where it failed and the first
  lines of its message, so that the tail of a long log (all a CI excerpt may keep) names them.
- The run's state (test databases on SQLite, broker folders, the passes' logs and reports)
  lives in one throwaway folder, each pass beside the main one in a folder of its own inside
  it. A run that made that folder removes it when every pass passed, and names it when one
  failed, for a look at what the passes left; a folder given as ``KUMO_VAR_DIR`` is kept.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
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

    # Python's byte-code cache, even where the environment turns it off: otherwise every Kumo
    # process the suite starts (gunicorn, controllers, agents, each pass's collection)
    # compiles Kumo's modules again and pytest rewrites every test module's asserts again:
    # about 1 s per process started and 15 s per collection on a 2-core machine. The caches
    # are __pycache__ folders, which git ignores.
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    # The suite's own state (SQLite file, broker folders, secret) lives in a throwaway folder.
    made = not env.get("KUMO_VAR_DIR")
    if made:
        env["KUMO_VAR_DIR"] = tempfile.mkdtemp(prefix="kumo-test-")
    env.setdefault("DATABASE_TEST_NAME", "test_kumo")

    print("kumo test run: " + "; ".join(notes), flush=True)
    for item in missing:
        print(f"  not available, its tests are skipped: {item}", flush=True)
    if missing and in_ci:
        print("CI must run on PostgreSQL and Redis: failing.", file=sys.stderr)
        return 2

    cmd = [sys.executable, "-m", "pytest", *sys.argv[1:]]
    if sys.argv[1:] or not env.get("DATABASE_URL", "").startswith("postgres"):
        status = subprocess.call(cmd, cwd=ROOT, env=env)
    else:
        status = passes(cmd, env)
    if made:
        throw_away(Path(env["KUMO_VAR_DIR"]), status)
    return status


def throw_away(var: Path, status: int) -> None:
    """The run's own folder: removed when the run passed, named when it failed."""
    if status == 0:
        shutil.rmtree(var, ignore_errors=True)
    else:
        print(f"kumo test run: its folder (logs, reports, SQLite files) is kept: {var}")


def passes(cmd: list[str], env: dict) -> int:
    """The whole suite on PostgreSQL. The real-guest test spends minutes waiting for a guest
    under QEMU's TCG, mostly on one core: it runs beside the main pass, on its own test
    database, followed by the embedded pass; so do the BESIDE modules, in a pass of their
    own. Their output follows the main pass's."""
    var = Path(env["KUMO_VAR_DIR"])
    side_log, beside_log = var / "side-chain.log", var / "beside.log"
    with side_log.open("w") as out, beside_log.open("w") as beside_out:
        side = subprocess.Popen(
            [sys.executable, "-c", SIDE_CHAIN, json.dumps(env)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        beside = subprocess.Popen(
            [*cmd, "-p", "no:cacheprovider", "-m", "not real_guest", *BESIDE,
             f"--timeout={BESIDE_TIMEOUT_S}", f"--junitxml={var / 'beside.xml'}"],
            cwd=ROOT, env=own_pass_env(env, "beside"), stdout=beside_out,
            stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(BESIDE_NICE),
        )  # fmt: skip
        status = subprocess.call(
            [*cmd, "-m", "not real_guest", *(f"--ignore={path}" for path in BESIDE),
             f"--junitxml={var / 'main.xml'}"],
            cwd=ROOT, env={**env, "KUMO_TEST_FILESYSTEM_BROKER_ELSEWHERE": "1"},
        )  # fmt: skip
        beside_status = beside.wait()
        side_status = side.wait()
    print(f"\nkumo test run: beside the main pass, {', '.join(BESIDE)}", flush=True)
    sys.stdout.write(beside_log.read_text())
    print("\nkumo test run: the real guest, then the embedded defaults", flush=True)
    sys.stdout.write(side_log.read_text())

    def said(code: int) -> str:
        return "passed" if code == 0 else f"FAILED ({code})"

    for report in ("main.xml", "beside.xml", "guest.xml", "embedded.xml"):
        for line in failures(var / report):
            print(line)
    print(
        f"\nkumo test run: main pass {said(status)}; pass beside it {said(beside_status)}; "
        f"real guest and embedded pass {said(side_status)}",
        flush=True,
    )
    return status or beside_status or side_status


#: Long modules that reach nothing outside their process and their test database (a replay
#: makes its own throwaway database): on PostgreSQL they run beside the main pass.
BESIDE = ("tests/test_api_fuzz.py", "tests/test_list_queries.py", "tests/compute/test_replay.py")
#: Their pass's niceness: the lowest priority, so that it never slows the passes that wait on a
#: clock (the real guests' boots and spot notice, the end-to-end tests' processes).
BESIDE_NICE = 19
#: Their tests' hang guard (the suite's is 300 s): at that priority a test may wait minutes for
#: a core while the other passes keep both busy (the guests' boots, the embedded pass).
BESIDE_TIMEOUT_S = 1200


def own_pass_env(env: dict, name: str) -> dict:
    """The environment of a pass beside the main one: its own test database, and its own
    folder inside the run's."""
    return {
        **env,
        "DATABASE_TEST_NAME": f"{env['DATABASE_TEST_NAME']}_{name}",
        "KUMO_VAR_DIR": tempfile.mkdtemp(prefix=f"{name}-", dir=env["KUMO_VAR_DIR"]),
    }


RECAP_LINES = 12
RECAP_WIDTH = 240


def failures(report: Path) -> list[str]:
    """The recap of one pass's JUnit report: for each failing test, its id, the lines of the
    suite its traceback went through (``path:line``, outermost first) and the first lines of
    its error, each cut to a width. Nothing for a pass that did not run or wrote no report."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return []
    lines = []
    for case in root.iter("testcase"):
        for failed in (*case.findall("failure"), *case.findall("error")):
            text = (failed.text or "").splitlines()
            frames = [line.split(": ")[0] for line in text if line.startswith("tests/")]
            lines.append(
                f"\nkumo test run: {report.stem} pass failed "
                f"{case.get('classname')}::{case.get('name')}"
                + (f" at {' > '.join(frames)}" if frames else "")
            )
            error = [line[1:].strip() for line in text if line.startswith("E ")]
            lines += [f"  {line[:RECAP_WIDTH]}" for line in error[:RECAP_LINES] if line]
    return lines


def side_chain(env: dict) -> int:
    """The real-guest test on its own test database, then the tests marked ``embedded`` or
    ``e2e`` on SQLite and the filesystem broker (what ``make run`` uses)."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    guest = own_pass_env(env, "guest")
    print("kumo test run: the real guest (PostgreSQL)", flush=True)
    var = Path(env["KUMO_VAR_DIR"])
    status = subprocess.call(
        [*pytest, "-m", "real_guest", f"--junitxml={var / 'guest.xml'}"], cwd=ROOT, env=guest
    )

    print("\nkumo test run: embedded defaults (SQLite, filesystem broker)", flush=True)
    embedded = own_pass_env(env, "embedded")
    embedded["DATABASE_URL"] = f"sqlite:///{embedded['KUMO_VAR_DIR']}/kumo.sqlite3"
    embedded.pop("KUMO_TEST_REDIS_URL", None)
    embedded_status = subprocess.call(
        [*pytest, "-m", "embedded or e2e", f"--junitxml={var / 'embedded.xml'}"],
        cwd=ROOT,
        env=embedded,
    )
    return status or embedded_status


SIDE_CHAIN = (
    "import json, sys; sys.path.insert(0, 'tests'); import run; "
    "sys.exit(run.side_chain(json.loads(sys.argv[1])))"
)


if __name__ == "__main__":
    sys.exit(main())
