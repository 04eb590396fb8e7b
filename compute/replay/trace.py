"""Job traces: the CSV an operator replays, and a synthetic month for an mdx-like fleet.

The format (a header, one job a line)::

    submit_s,duration_s,gpus,gpu_model,priority,project[,vcpus,memory_gib,checkpoint_s]

``submit_s``: seconds from the trace's start; ``duration_s``: the work the job needs once
running; ``gpus``: 0 (a CPU job), 1, 2, 4 or 8; ``priority``: ``on_demand`` or ``spot``;
``vcpus``/``memory_gib``: default 16 and 57 per GPU (4 and 16 for a CPU job);
``checkpoint_s``: how often a spot job checkpoints (work since the last checkpoint is lost
at an eviction; default 1800).

The generator draws job sizes and durations shaped after the published studies of
production GPU clusters: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for
DNN Training Workloads" (Microsoft Philly, USENIX ATC'19): most jobs take one GPU, a few
take 8 or more, and run times are heavy-tailed over minutes to days (we use a log-normal
with a median of two hours and a long tail, capped at 3 days); Hu et al. (SenseTime
Helios, SC'21) report the same shape. Arrivals are Poisson with a daily cycle for
on-demand work; spot work arrives evenly and is sized to exceed what on-demand leaves free.
It is a model of those distributions, not a copy of either trace.

How many jobs a month holds follows from the load and the mean job: the fleet's GPU-hours
at the loads asked for, over a job's mean GPU-hours. The median sets that density. With
two hours, the generated month for 320 GPUs holds about 21,900 jobs, 2.3 a GPU a day. That
is still denser than the published traces: Philly's holds 117,325 jobs over 4.5 months
on a cluster of thousands of GPUs. A median of 40 minutes, this generator's until
2026-12, made 57,011 jobs: 5.9 a GPU a day, many times the published density for the
same GPU-hours. ``median_s`` sets it for a denser or sparser trace.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

HEADER = ["submit_s", "duration_s", "gpus", "gpu_model", "priority", "project"]
OPTIONAL = ["vcpus", "memory_gib", "checkpoint_s"]
MODEL = "A100-SXM4-40GB"


@dataclass
class Job:
    index: int
    submit_s: float
    duration_s: float
    gpus: int
    gpu_model: str
    priority: str
    project: str
    vcpus: int
    memory_gib: int
    checkpoint_s: float


class TraceError(ValueError):
    """A trace line that cannot be replayed; the message names the line and the field."""


def read_trace(path: str | Path) -> list[Job]:
    """The jobs of the CSV at ``path``, by submit time."""
    jobs = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [h for h in HEADER if h not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"the header lacks {', '.join(missing)}")
        for n, row in enumerate(reader, start=2):
            try:
                gpus = int(row["gpus"])
                job = Job(
                    index=len(jobs),
                    submit_s=float(row["submit_s"]),
                    duration_s=float(row["duration_s"]),
                    gpus=gpus,
                    gpu_model=(row["gpu_model"] or MODEL) if gpus else "",
                    priority=row["priority"],
                    project=row["project"],
                    vcpus=int(row.get("vcpus") or (16 * gpus if gpus else 4)),
                    memory_gib=int(row.get("memory_gib") or (57 * gpus if gpus else 16)),
                    checkpoint_s=float(row.get("checkpoint_s") or 1800),
                )
            except (TypeError, ValueError) as e:
                raise TraceError(f"line {n}: {e}") from None
            if gpus not in (0, 1, 2, 4, 8):
                raise TraceError(f"line {n}: gpus must be 0, 1, 2, 4 or 8")
            if job.priority not in ("on_demand", "spot"):
                raise TraceError(f"line {n}: priority must be on_demand or spot")
            if job.duration_s <= 0 or job.submit_s < 0:
                raise TraceError(f"line {n}: submit_s must be >= 0 and duration_s > 0")
            jobs.append(job)
    jobs.sort(key=lambda j: (j.submit_s, j.index))
    return jobs


def generate(
    path: str | Path,
    *,
    days: float = 30,
    gpu_hosts: int = 40,
    on_demand_load: float = 0.55,
    spot_load: float = 0.75,
    cpu_jobs_per_day: float = 40,
    projects: int = 10,
    seed: int = 16,
    median_s: float = 7200.0,
) -> int:
    """Write a synthetic trace of ``days`` for ``gpu_hosts`` 8-GPU hosts to ``path``:
    on-demand work worth ``on_demand_load`` of the GPU capacity, spot work worth
    ``spot_load`` (together more than the fleet: spot demand exceeds free capacity), and
    a few CPU jobs; run times are log-normal around ``median_s`` (see the module's
    docstring). Returns the number of jobs."""
    rng = random.Random(seed)
    capacity_gpu_s = gpu_hosts * 8 * days * 86400
    sizes, weights = [1, 2, 4, 8], [0.62, 0.14, 0.12, 0.12]
    mean_gpus = sum(s * w for s, w in zip(sizes, weights, strict=True))
    sigma, cap_s = 1.6, 3 * 86400.0

    def duration() -> float:
        return min(cap_s, max(60.0, rng.lognormvariate(math.log(median_s), sigma)))

    # The mean of the capped log-normal, by sampling (exact enough for a rate).
    probe = random.Random(seed + 1)
    mean_s = (
        sum(
            min(cap_s, max(60.0, probe.lognormvariate(math.log(median_s), sigma)))
            for _ in range(20000)
        )
        / 20000
    )
    rows = []
    for priority, load in (("on_demand", on_demand_load), ("spot", spot_load)):
        rate = load * capacity_gpu_s / (mean_gpus * mean_s) / (days * 86400)  # jobs per s
        t = 0.0
        while True:
            # On-demand follows a daily cycle (thinning of a Poisson process at 1.5x).
            t += rng.expovariate(rate * (1.5 if priority == "on_demand" else 1.0))
            if t >= days * 86400:
                break
            if priority == "on_demand":
                phase = math.sin(2 * math.pi * (t % 86400) / 86400)
                if rng.random() > (1 + 0.5 * phase) / 1.5:
                    continue
            gpus = rng.choices(sizes, weights)[0]
            project = f"p{rng.randrange(projects):02d}"
            rows.append((t, duration(), gpus, MODEL, priority, project, 16 * gpus, 57 * gpus, 1800))
    t = 0.0
    while cpu_jobs_per_day:
        t += rng.expovariate(cpu_jobs_per_day / 86400)
        if t >= days * 86400:
            break
        vcpus = rng.choice([4, 8, 16, 32])
        rows.append(
            (
                t,
                duration(),
                0,
                "",
                "on_demand",
                f"p{rng.randrange(projects):02d}",
                vcpus,
                4 * vcpus,
                1800,
            )
        )
    rows.sort()
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER + OPTIONAL)
        for t, d, gpus, model, priority, project, vcpus, memory, ckpt in rows:
            writer.writerow(
                [f"{t:.1f}", f"{d:.1f}", gpus, model, priority, project, vcpus, memory, ckpt]
            )
    return len(rows)
