"""Start and stop real Kumo processes (web, controller, agents) for end-to-end tests."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from django.db import connection

from compute.models import VirtualMachine
from controlplane.management.commands.run import topology

ROOT = Path(__file__).resolve().parents[2]
# A log line worth showing when a test fails, wherever it is in the log; Celery's warning
# that a worker named no hostname is in every agent's log, and says nothing of the failure.
_NOTABLE = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|^\S*(Error|Exception)\b")
_NOISE = re.compile(r"No hostname was supplied")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url() -> str:
    """The URL of the test database this test process uses, for the processes it starts."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Fleet:
    """A set of started processes sharing one environment; ``stop()`` ends them all."""

    def __init__(self, env: dict, log_dir: Path):
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc._kumo_log = log
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        _signal(proc, sig)
        proc.wait(timeout=30)
        proc._kumo_log.close()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every process at once, then SIGKILL to those still running after
        ``grace_s``: one grace for the whole fleet, not one after another."""
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            _signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait(timeout=30)
            proc._kumo_log.close()

    def logs(self) -> str:
        """Each process's log: its warnings, errors and tracebacks from the whole run (a
        periodic task's lines soon push them out of the tail), then its tail. The logs with
        such lines come first, most first: a report that shows only its first lines (CI's
        recap) shows the process that met the failure."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace")
            notable = [
                line
                for line in text.splitlines()
                if _NOTABLE.search(line) and not _NOISE.search(line)
            ]
            parts.append(
                (
                    -len(notable),
                    f"--- {path.name}: warnings, errors and tracebacks\n"
                    + "\n".join(notable[-60:])
                    + f"\n--- {path.name}: its tail\n{text[-3000:]}",
                )
            )
        return "\n".join(part for _, part in sorted(parts, key=lambda part: part[0]))


def _signal(proc: subprocess.Popen, sig) -> None:
    """``sig`` to ``proc``'s whole process group (it started a session), if still there."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def start_topology(
    fleet: Fleet, *, bind: str, hosts: list[str], only=None, uris=None, agent_args=None
) -> None:
    processes = topology(sys.executable, bind=bind, hosts=hosts, uris=uris, agent_args=agent_args)
    for name, argv in processes.items():
        if only is None or name in only:
            fleet.start(name, argv)


def wait_for(
    predicate, *, timeout: float, what: str, fleet: Fleet | None = None, interval: float = 0.2
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    fail(f"timed out waiting for {what}", fleet)


def fail(what: str, fleet: Fleet | None = None) -> NoReturn:
    """Fail the test saying ``what``, with every VM's row and the fleet's logs: why a VM
    ended where it did is in its ``state_reason`` and the agent's log, not in its state."""
    detail = f"\n{vm_rows()}\n{fleet.logs()}" if fleet else ""
    raise AssertionError(f"{what}{detail}")


def vm_rows() -> str:
    """Every VM as the database has it, one line each: what a timed-out wait saw last."""
    fields = ("id", "name", "state", "task_state", "host__name", "generation")
    fields += ("applied_generation", "power_state", "state_reason", "updated_at")
    try:
        rows = list(VirtualMachine.objects.order_by("created_at").values_list(*fields))
    except Exception as e:  # the timeout is the failure to report, not this
        return f"--- VMs: not read ({e})"
    return "--- VMs (" + ", ".join(fields) + ")\n" + "\n".join(map(repr, rows))
