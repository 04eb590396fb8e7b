"""Replaying a month of demand through Kumo's own scheduler: ``trace`` reads and
generates job traces, ``sim`` runs one on a simulated fleet in virtual time, ``database``
gives it a throwaway database. Run it with ``manage.py replay TRACE.csv`` or
``bench/goodput.py``."""

import os
import sys

#: The string-hash seed every replay runs with (see ``fixed_hash_seed``).
HASH_SEED = "0"


def fixed_hash_seed() -> None:
    """Run this program again with ``PYTHONHASHSEED`` fixed, unless it already runs so.

    A replay is deterministic only with it: two processes with different string-hash seeds
    replayed the same day to different figures, and the same figures once the seed was
    fixed (the order of some iteration over strings on the way reaches a decision; which
    one is not found yet). Python fixes the seed at start, hence the new process: call this
    first thing in a program's entry point, never from a library call (it replaces the
    process)."""
    if os.environ.get("PYTHONHASHSEED") == HASH_SEED:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, "PYTHONHASHSEED": HASH_SEED})
