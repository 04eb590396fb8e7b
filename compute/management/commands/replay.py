"""``manage.py replay TRACE.csv``: replay a job trace through Kumo's own services on a
simulated fleet, in virtual time, on a throwaway database (``compute.replay``).

Prints one JSON line of figures (GPU-hours by category, goodput, waits, evictions,
guarantees) and, with ``--plot``, writes a PNG of allocated GPUs over time by priority.
``--generate DAYS`` writes a synthetic trace to TRACE.csv first. Never touches the
database Kumo runs on: it makes a new one beside it and drops it at the end.
"""

import json
import sys
from contextlib import nullcontext

from django.core.management.base import BaseCommand, CommandError

from compute.replay import fixed_hash_seed
from compute.replay import trace as traces
from compute.replay.database import throwaway_database
from compute.replay.sim import Replay
from controlplane.supervise import terminated_as_interrupted


class Command(BaseCommand):
    help = "Replay a job trace (CSV) through Kumo's scheduler on a simulated fleet."

    def add_arguments(self, parser):
        parser.add_argument(
            "trace", help="CSV: submit_s,duration_s,gpus,gpu_model,priority,project"
        )
        parser.add_argument("--gpu-hosts", type=int, default=40, help="8-GPU hosts (40)")
        parser.add_argument("--cpu-hosts", type=int, default=8, help="CPU hosts (8)")
        parser.add_argument("--notice-s", type=int, default=30, help="spot eviction notice (30)")
        parser.add_argument("--boot-s", type=float, default=60.0, help="simulated boot (60)")
        parser.add_argument("--stop-s", type=float, default=10.0, help="simulated stop (10)")
        parser.add_argument(
            "--guarantee",
            action="append",
            default=[],
            metavar="PROJECT=GPUS",
            help="a guaranteed minimum of GPUs for a project of the trace (repeatable)",
        )
        parser.add_argument(
            "--lease",
            action="append",
            default=[],
            metavar="PROJECT=GPUS@START_S-END_S[,keep-idle]",
            help="a lease of GPUs for a project, in trace seconds (repeatable); it lends its "
            "idle GPUs to spot VMs unless ',keep-idle' follows",
        )
        parser.add_argument("--plot", default="", help="write the allocation plot here (PNG)")
        parser.add_argument(
            "--generate",
            type=float,
            default=0,
            metavar="DAYS",
            help="write a synthetic trace first",
        )
        parser.add_argument("--seed", type=int, default=16)
        parser.add_argument(
            "--no-checkpoint-reports",
            action="store_true",
            help="spot guests checkpoint but do not tell Kumo (preemption knows their starts)",
        )

    def handle(self, *args, **opts):
        program = sys.argv[1:2] == ["replay"]  # run as ``manage.py replay``, not by call_command
        if program:
            fixed_hash_seed()
        # As a program, a SIGTERM still drops the throwaway database, as Ctrl-C does. A
        # program replays once; a process that calls the command more often (the test suite)
        # migrates its throwaway databases once.
        with terminated_as_interrupted() if program else nullcontext():
            self._replay(opts, reuse_migrations=not program)

    def _replay(self, opts, *, reuse_migrations: bool):
        if opts["generate"]:
            n = traces.generate(
                opts["trace"], days=opts["generate"], gpu_hosts=opts["gpu_hosts"], seed=opts["seed"]
            )
            self.stderr.write(f"replay: wrote {n} jobs to {opts['trace']}")
        try:
            jobs = traces.read_trace(opts["trace"])
        except (OSError, traces.TraceError) as e:
            raise CommandError(f"{opts['trace']}: {e}") from None
        guarantees = {}
        for item in opts["guarantee"]:
            project, _, gpus = item.partition("=")
            if not gpus.isdigit():
                raise CommandError(f"--guarantee {item!r}: expected PROJECT=GPUS")
            guarantees[project] = int(gpus)
        leases = [_lease(item) for item in opts["lease"]]
        replay = Replay(
            jobs,
            leases=leases,
            gpu_hosts=opts["gpu_hosts"],
            cpu_hosts=opts["cpu_hosts"],
            notice_s=opts["notice_s"],
            boot_s=opts["boot_s"],
            stop_s=opts["stop_s"],
            guarantees=guarantees,
            checkpoint_reports=not opts["no_checkpoint_reports"],
            progress=lambda message: self.stderr.write(f"replay: {message}"),
        )
        with throwaway_database(reuse_migrations=reuse_migrations):
            figures = replay.run()
        if opts["plot"]:
            replay.plot(opts["plot"])
        sys.stdout.write(json.dumps(figures, sort_keys=True) + "\n")


def _lease(item: str) -> dict:
    """``PROJECT=GPUS@START_S-END_S[,keep-idle]`` as the replay's lease plan."""
    item, _, option = item.partition(",")
    if option not in ("", "keep-idle"):
        raise CommandError(f"--lease {item!r}: ',{option}' is not ',keep-idle'")
    project, _, rest = item.partition("=")
    gpus, _, period = rest.partition("@")
    start, _, end = period.partition("-")
    try:
        plan = {"project": project, "gpus": int(gpus), "start_s": float(start), "end_s": float(end)}
    except ValueError:
        raise CommandError(f"--lease {item!r}: expected PROJECT=GPUS@START_S-END_S") from None
    if not project or plan["end_s"] <= plan["start_s"]:
        raise CommandError(f"--lease {item!r}: name a project and end after the start")
    plan["lend_idle"] = option != "keep-idle"
    return plan
