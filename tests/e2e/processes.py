"""Start and stop real Kumo processes (web, controller, agents) for end-to-end tests."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.db import connection

from controlplane.management.commands.run import topology

ROOT = Path(__file__).resolve().parents[2]


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
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
        proc._kumo_log.close()

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in self.log_dir.glob("*.log")
        )


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
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{fleet.logs()}" if fleet else ""))
