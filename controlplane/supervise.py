"""``python -m controlplane.supervise NAME -- ARGV...``: run ARGV and restart it when it exits.

What systemd's ``Restart=always`` does for the units in ``deploy/systemd/``, for
``manage.py run``: honcho stops every process as soon as one exits, so each process runs
under this small supervisor instead, and one that exits (a crash, a lost broker) is started
again after a backoff (1 s, doubling to ``MAX_BACKOFF_S``; back to 1 s once it ran for
``STABLE_S``). One line says so; nothing else changes for the others.

SIGTERM or SIGINT to the supervisor is passed on once to the child's process group and the
supervisor exits with the child, restarting nothing. The child runs in its own process group
(so honcho's signal to the supervisor's group does not reach it twice) and is killed if the
supervisor dies first (Linux ``PR_SET_PDEATHSIG``), so nothing outlives a ``kill -9``.
Django-free: it imports nothing of Kumo.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import weakref

MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
_PR_SET_PDEATHSIG = 1


#: How soon a SIGTERM held back from a finalizer is raised again.
HELD_SIGNAL_RETRY_S = 0.05


@contextlib.contextmanager
def terminated_as_interrupted():
    """Within the block, SIGTERM (``kill``, a CI job cancelled) ends the program as Ctrl-C
    does, through every ``finally``: what it made to throw away (a database, a folder) goes
    with it, where the default handler would end the process at once and leave it behind.
    For a program's main thread (where Python runs signal handlers).

    A SIGTERM that lands while a finalizer runs (a ``__del__``, a ``weakref.finalize``
    callback) is held: Python would report the exception raised there and carry on, and the
    program would run to its end. It is raised ``HELD_SIGNAL_RETRY_S`` later, out of the
    finalizer (SIGALRM, as the block's own timer; the timer and handler found are put back
    at the end)."""
    held: list[int] = []

    def stop(signum, frame):
        if _in_finalizer(frame):
            held[:] = [signum]
            signal.signal(signal.SIGALRM, again)
            signal.setitimer(signal.ITIMER_REAL, HELD_SIGNAL_RETRY_S)
            return
        held.clear()
        raise SystemExit(128 + signum)

    def again(_signum, frame):
        if held:
            stop(held[0], frame)

    previous = signal.signal(signal.SIGTERM, stop)
    previous_alarm = signal.getsignal(signal.SIGALRM)
    previous_timer = signal.getitimer(signal.ITIMER_REAL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if signal.getsignal(signal.SIGALRM) is again:
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)
            signal.signal(signal.SIGALRM, previous_alarm)


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a finalizer, where an exception raised is reported and
    dropped: a ``__del__`` method, or a ``weakref.finalize`` calling its function."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
            code.co_name == "__call__" and code.co_filename == weakref.__file__
        ):
            return True
        frame = frame.f_back
    return False


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Supervisor:
    def __init__(self, name: str, argv: list[str], *, first_backoff_s: float = 1.0):
        self.name = name
        self.argv = argv
        self.first_backoff_s = first_backoff_s
        self.child: subprocess.Popen | None = None
        self.stopping = False
        self.restarts = 0

    def _say(self, text: str) -> None:
        print(f"supervise {self.name}: {text}", file=sys.stderr, flush=True)

    def stop(self, signum, _frame=None) -> None:
        if self.stopping:
            return
        self.stopping = True
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        backoff = self.first_backoff_s
        while True:
            started = time.monotonic()
            self.child = subprocess.Popen(
                self.argv, start_new_session=True, preexec_fn=_die_with_parent
            )
            if self.stopping:  # a signal arrived while it was starting
                self.stop(signal.SIGTERM)
            returncode = self.child.wait()
            if self.stopping:
                return returncode
            if time.monotonic() - started >= STABLE_S:
                backoff = self.first_backoff_s
            self._say(f"exited with {returncode}; restarting in {backoff:g} s")
            deadline = time.monotonic() + backoff
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.stopping:
                return returncode
            self.restarts += 1
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m controlplane.supervise NAME -- ARGV...", file=sys.stderr)
        return 2
    return Supervisor(argv[0], argv[2:]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
