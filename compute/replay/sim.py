"""The replay: a job trace through Kumo's own services on a simulated fleet, in virtual time.

Leases (``leases``: project, GPUs, start and end in trace seconds, and ``lend_idle``,
whether spot VMs may borrow its idle GPUs, by default they may) are admitted at the
start through ``lease_create``; ``leases_tick`` runs when one is due (its lead before the
start, its start, its lead before the end, its end). An on-demand job of a lease's project
submitted while the lease holds, and that fits it, runs in it; at the lease's end its VMs
are shelved and their jobs end with it. ``leases_honoured`` is the share of samples at
which every active lease held all its GPUs.

What is real and what is simulated:

- **Real**: every decision and every write. Jobs become VMs through ``vm_create`` (quota,
  guarantees' admission, placement and its claim, spot preemption and notices), leave
  through ``vm_delete``; the periodic work beat would run is called when it would matter:
  ``vm_schedule_pending`` whenever capacity was freed, ``evictions_reap`` at each notice's
  deadline; hosts' answers go through ``vm_observed`` (the hand-over of evictions, usage
  intervals, shelving). The database is a real one (PostgreSQL for the bench), throwaway.
- **Simulated**: the clock and the hosts. ``django.utils.timezone.now`` answers the virtual
  clock, which jumps from event to event and never sleeps. Messages to host agents are
  captured instead of published; a simulated agent answers each ``vm_apply`` after a
  realistic delay (boot ``boot_s``, stop ``stop_s``) with the power it reached.

A job's life: submitted → its VM pending or placed (its wait ends at the claim) → booting
(held) → running (work) → deleted when its work is done. A spot job evicted loses its work
since its last checkpoint and is started again (``vm_start``), waiting like a new request.

GPU-hours are integrated exactly over the event times, per category: on-demand work, spot
work, held idle (claimed but not working: boots, notices' stop, deletions), free while a
request waited (free GPUs while GPU requests are pending, up to their size), and free;
they add up to the capacity. Two parts of the free ones are sampled every ``sample_s``
while jobs arrive: stranded (free GPUs on hosts without the vCPUs or memory one more GPU
needs) and lease idle (GPUs a lease holds that no VM uses: free for its project alone,
or for a spot VM that borrows them).

``goodput`` is tenant work, less spot work lost to evictions, over the capacity of the
whole replay, its ramp-up from an empty fleet and its drain after the last submission
included. ``goodput_while_spot_waits`` is the same ratio over the time the spot work waiting
exceeded the free GPUs while jobs still arrived (``spot_waits_days``): how much of a fleet
that is wanted whole does tenant work under Kumo's policies. The drain is not that time: no
request arrives any more, and the few GPUs on each host that the last long jobs leave
cannot take the 4- and 8-GPU requests still waiting, which a fleet in use would fill.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from compute.replay.database import vacuum_as_autovacuum_would
from compute.replay.trace import Job
from controlplane.compiled import Compiled

log = logging.getLogger(__name__)


def _notices():
    from compute.choices import VmState, VmTask
    from compute.models import VirtualMachine

    return (
        VirtualMachine.objects.filter(state=VmState.EVICTING, task_state=VmTask.NONE)
        .order_by("pk")
        .values_list("pk", "eviction_deadline")
    )


#: The notices given and not yet reaped, read after every decision that may give one.
_NOTICES = Compiled(_notices)

EPOCH = datetime(2031, 1, 1, tzinfo=UTC)


# The reads of every sample (``Replay._on_sample``), compiled once: a month has 4,320.


def _free_gpus():
    from django.db.models import Count

    from compute.choices import DeviceKind
    from compute.models import Device

    return (
        Device.objects.filter(kind=DeviceKind.GPU, present=True, vm__isnull=True)
        .values("host_id")
        .annotate(n=Count("pk"))
        .values_list("host_id", "n")
        .order_by()
    )


def _host_room():
    from compute.models import Host

    return Host.objects.values_list(
        "pk", "vcpus", "vcpus_used", "memory_mib", "memory_mib_used"
    ).order_by()


def _lease_idle():
    from compute.choices import DeviceKind
    from compute.models import Device

    return Device.objects.filter(
        kind=DeviceKind.GPU, present=True, vm__isnull=True, lease__isnull=False
    ).values_list("pk")


def _on_demand_gpus():
    from django.db.models import Sum

    from compute.choices import VmState
    from compute.models import VirtualMachine

    return (
        VirtualMachine.objects.filter(priority="on_demand", gpus__gt=0, host__isnull=False)
        .exclude(state=VmState.DELETED)
        .values("project_id")
        .annotate(n=Sum("gpus"))
        .values_list("project_id", "n")
        .order_by()
    )


def _active_leases():
    from django.db.models import Count

    from compute.choices import LeaseState
    from compute.models import Lease

    return (
        Lease.objects.filter(state=LeaseState.ACTIVE)
        .annotate(held=Count("devices"))
        .values_list("gpus", "held")
        .order_by()
    )


_FREE_GPUS = Compiled(_free_gpus)
_HOST_ROOM = Compiled(_host_room)
_LEASE_IDLE = Compiled(_lease_idle)
_ON_DEMAND_GPUS = Compiled(_on_demand_gpus)
_ACTIVE_LEASES = Compiled(_active_leases)


@contextmanager
def _fresh_views(*views):
    """The process's cached views start empty and are left empty: none outlives the
    database or the clock it was read with."""
    for v in views:
        v.invalidate()
    try:
        yield
    finally:
        for v in views:
            v.invalidate()


@dataclass
class _Vm:
    job: Job
    vm_id: str
    placed_at: float | None = None
    run_start: float | None = None
    progress: float = 0.0  # checkpointed work, seconds
    run: int = 0  # bumps on each start: stale job ends are ignored
    claimed: bool = False
    working: bool = False
    host: str = ""
    stop_sent_at: float | None = None
    guest: object = None  # the VM as its guest and its owner name it (``Replay._guest``)


@dataclass
class Metrics:
    gpus_total: int = 0
    t: float = 0.0
    od_work: float = 0.0
    spot_work: float = 0.0
    held_idle: float = 0.0
    free: float = 0.0
    free_waiting: float = 0.0
    stranded: float = 0.0
    lease_idle: float = 0.0  # sampled: free GPUs a lease held (kept off every other VM)
    spot_lost: float = 0.0
    waits: list = field(default_factory=list)
    evictions: int = 0
    full_notice: int = 0
    guarantee_samples: int = 0
    guarantee_ok: int = 0
    lease_samples: int = 0
    lease_ok: int = 0
    # While waiting spot work exceeds the free GPUs (the fleet is wanted whole):
    saturated: float = 0.0  # seconds
    saturated_capacity: float = 0.0  # GPU-seconds
    saturated_work: float = 0.0  # GPU-seconds of tenant work
    saturated_lost: float = 0.0  # GPU-seconds of spot work lost to evictions then
    saturated_held: float = 0.0  # GPU-seconds held idle then (boots, stops)
    saturated_free: float = 0.0  # GPU-seconds free then (no waiting request fitted them)
    saturated_lease_idle: float = 0.0  # of which a lease held (sampled)
    series: list = field(default_factory=list)  # (t, on-demand GPUs, spot GPUs)


class Replay:
    """One replay of ``jobs``. ``run()`` returns the figures (a dict)."""

    def __init__(
        self,
        jobs: list[Job],
        *,
        gpu_hosts: int = 40,
        cpu_hosts: int = 8,
        boot_s: float = 60.0,
        stop_s: float = 10.0,
        notice_s: int = 30,
        guarantees: dict[str, int] | None = None,
        leases: list[dict] | None = None,
        sample_s: float = 600.0,
        schedule_limit: int = 100,  # as many as the beat's pass tries
        seed: int = 0,  # the scheduler's start among equally good hosts
        checkpoint_reports: bool = True,  # spot guests tell Kumo of each checkpoint
        progress=None,
    ):
        self.schedule_limit = schedule_limit
        self.checkpoint_reports = checkpoint_reports
        self.seed = seed
        self.handled = 0  # events handled
        self.jobs = jobs
        self.gpu_hosts, self.cpu_hosts = gpu_hosts, cpu_hosts
        self.boot_s, self.stop_s, self.notice_s = boot_s, stop_s, notice_s
        self.guarantees = guarantees or {}
        self.lease_plans = leases or []
        self.leases: dict[str, list] = {}  # project slug -> its Lease rows
        self.sample_s = sample_s
        self.progress = progress or (lambda message: None)
        self.now_s = 0.0
        self.events: list = []
        self.seq = itertools.count()
        self.outbox: list = []
        self.vms: dict[str, _Vm] = {}
        self.pending: dict[str, int] = {}  # vm id -> GPUs, while waiting for a claim
        self.pending_gpus = self.pending_spot_gpus = 0  # their sums
        self.reaps: set = set()  # (vm id, deadline) of the notices given
        self.m = Metrics()
        self.arrivals_end = 0.0  # the last submission
        self.od_gpus = self.spot_gpus = self.held_gpus = 0

    # -- the clock and the agents ------------------------------------------------------------

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now_s)

    def _at(self, t: float, kind: str, *data) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, data))

    def _capture(self, name, kwargs=None, queue="", **_):
        self.outbox.append((queue, name, kwargs or {}))

    def _drain(self) -> None:
        """The simulated agents receive what the services sent and answer later."""
        from compute.protocol import VM_APPLY_TASK

        while self.outbox:
            queue, name, kwargs = self.outbox.pop(0)
            if name != VM_APPLY_TASK:
                continue
            host = queue.removeprefix("host.")
            desired = kwargs["desired"]
            vm = self.vms.get(kwargs["vm_id"])
            if desired == "running":
                power, delay = "running", self.boot_s
                if vm is not None and vm.placed_at is None:
                    vm.placed_at = self.now_s
                    self._claimed(vm, host)
            elif desired == "stopped":
                power, delay = "shutoff", self.stop_s
                if vm is not None:
                    self._stop_began(vm)
            else:
                power, delay = "absent", self.stop_s
            self._at(
                self.now_s + delay,
                "report",
                host,
                kwargs["vm_id"],
                kwargs["generation"],
                power,
                kwargs.get("operation_id", ""),
            )

    # -- accounting ----------------------------------------------------------------------------

    def _advance(self, t: float) -> None:
        dt = t - self.m.t
        if dt > 0:
            m = self.m
            od, spot, held = self.od_gpus, self.spot_gpus, self.held_gpus
            m.od_work += od * dt
            m.spot_work += spot * dt
            m.held_idle += held * dt
            free = m.gpus_total - od - spot - held
            waiting = min(free, self.pending_gpus)
            m.free_waiting += waiting * dt
            m.free += (free - waiting) * dt
            # Saturated: while jobs still arrive (not the drain: see the module's docstring)
            # and spot work waits beyond the free GPUs.
            wanted = max(0.0, min(t, self.arrivals_end) - m.t)
            if wanted and self.pending_spot_gpus > free:
                m.saturated += wanted
                m.saturated_capacity += m.gpus_total * wanted
                m.saturated_work += (od + spot) * wanted
                m.saturated_held += held * wanted
                m.saturated_free += free * wanted
            m.t = t
        self.now_s = t

    def _spot_waits(self) -> bool:
        """Now is time the spot work waiting exceeds the free GPUs while jobs still arrive."""
        free = self.m.gpus_total - self.od_gpus - self.spot_gpus - self.held_gpus
        return self.now_s <= self.arrivals_end and self.pending_spot_gpus > free

    def _mark(self) -> None:
        self.m.series.append((self.now_s, self.od_gpus, self.spot_gpus))

    def _wait(self, vm: _Vm) -> None:
        """``vm`` waits for a claim."""
        if vm.job.gpus and vm.vm_id not in self.pending:
            self.pending[vm.vm_id] = vm.job.gpus
            self.pending_gpus += vm.job.gpus
            self.pending_spot_gpus += vm.job.gpus if vm.job.priority == "spot" else 0

    def _claimed(self, vm: _Vm, host: str) -> None:
        gpus = self.pending.pop(vm.vm_id, 0)
        self.pending_gpus -= gpus
        self.pending_spot_gpus -= gpus if vm.job.priority == "spot" else 0
        vm.claimed, vm.host = True, host
        self.held_gpus += vm.job.gpus
        if vm.job.priority == "on_demand" and vm.job.gpus:
            self.m.waits.append(self.now_s - vm.job.submit_s)

    def _work_started(self, vm: _Vm) -> None:
        vm.working, vm.run_start = True, self.now_s
        vm.run += 1
        self.held_gpus -= vm.job.gpus
        if vm.job.priority == "on_demand":
            self.od_gpus += vm.job.gpus
        else:
            self.spot_gpus += vm.job.gpus
        self._at(self.now_s + vm.job.duration_s - vm.progress, "end", vm.vm_id, vm.run)
        self._checkpoint_due(vm, 1)
        self._mark()

    def _checkpoint_due(self, vm: _Vm, n: int) -> None:
        """A spot job's guest reports its ``n``-th checkpoint of this run, if it makes it
        before its end (as ``_stop_began`` counts them: every ``checkpoint_s`` from its start)."""
        if not self.checkpoint_reports or vm.job.priority != "spot":
            return
        if n * vm.job.checkpoint_s < vm.job.duration_s - vm.progress:
            self._at(vm.run_start + n * vm.job.checkpoint_s, "checkpoint", vm.vm_id, vm.run, n)

    def _work_stopped(self, vm: _Vm) -> None:
        if not vm.working:
            return
        vm.working = False
        if vm.job.priority == "on_demand":
            self.od_gpus -= vm.job.gpus
        else:
            self.spot_gpus -= vm.job.gpus
        self.held_gpus += vm.job.gpus
        self._mark()

    def _stop_began(self, vm: _Vm) -> None:
        """Its guest is told to stop (an eviction's notice ended): its work since its last
        checkpoint is lost."""
        vm.stop_sent_at = self.now_s
        if not vm.working:
            return
        done = self.now_s - vm.run_start
        kept = (done // vm.job.checkpoint_s) * vm.job.checkpoint_s
        self.m.spot_lost += (done - kept) * vm.job.gpus
        if self._spot_waits():
            self.m.saturated_lost += (done - kept) * vm.job.gpus
        vm.progress += kept
        vm.run += 1  # its scheduled end no longer holds
        self._work_stopped(vm)

    def _released(self, vm: _Vm) -> None:
        if vm.claimed:
            vm.claimed = False
            self.held_gpus -= vm.job.gpus
            self._mark()

    # -- the replay ----------------------------------------------------------------------------

    def _setup(self) -> None:
        from compute import services as compute
        from compute.drivers import simnode
        from compute.models import Template
        from compute.protocol import inventory_payload
        from tenants import services as tenants
        from tenants.models import User

        now = self.now()
        for n in range(self.gpu_hosts):
            name = f"gpu-{n:03d}"
            compute.host_heartbeat(host=name, payload={}, sent_at=now)
            compute.inventory_reported(
                host=name, payload=inventory_payload(simnode.host_inventory("gpu")), sent_at=now
            )
        for n in range(self.cpu_hosts):
            name = f"cpu-{n:03d}"
            compute.host_heartbeat(host=name, payload={}, sent_at=now)
            compute.inventory_reported(
                host=name, payload=inventory_payload(simnode.host_inventory("cpu")), sent_at=now
            )
        from compute.models import Device

        self.m.gpus_total = Device.objects.filter(kind="gpu", present=True).count()
        owner = User.objects.create(username="replay")
        big = {"vms": 10**6, "vcpus": 10**8, "memory_gib": 10**9, "gpus": 10**6}
        self.projects = {}
        lessees = {plan["project"] for plan in self.lease_plans}
        for slug in sorted({j.project for j in self.jobs} | set(self.guarantees) | lessees):
            self.projects[slug] = tenants.project_create(
                slug=slug, name=slug, owner=owner, quota=big
            )
        for slug, gpus in self.guarantees.items():
            compute.guarantee_set(project=self.projects[slug], min_gpus=gpus)
        self._plan_leases()
        self.image = compute.image_create(
            name="replay",
            os_distro="ubuntu",
            format="qcow2",
            location="/var/lib/kumo/images/replay.qcow2",
            checksum="sha256:" + "0" * 64,
        )
        self.templates = {}
        for j in self.jobs:
            key = (j.gpus, j.gpu_model, j.vcpus, j.memory_gib)
            if key not in self.templates:
                self.templates[key] = Template.objects.filter(
                    name=f"r{len(self.templates)}"
                ).first() or compute.template_create(
                    name=f"r{len(self.templates)}",
                    vcpus=j.vcpus,
                    memory_gib=j.memory_gib,
                    gpus=j.gpus,
                    gpu_model=j.gpu_model,
                    disk_gib=40,
                    eviction_notice_s=self.notice_s,
                )

    def _plan_leases(self) -> None:
        from django.conf import settings

        from compute import services as compute

        lead = settings.LEASE_LEAD_S
        for n, plan in enumerate(self.lease_plans):
            start, end = plan["start_s"], plan["end_s"]
            lease = compute.lease_create(
                project=self.projects[plan["project"]],
                name=f"lease-{n}",
                gpus=plan["gpus"],
                starts_at=EPOCH + timedelta(seconds=start),
                ends_at=EPOCH + timedelta(seconds=end),
                lend_idle=plan.get("lend_idle", True),
            )
            self.leases.setdefault(plan["project"], []).append(lease)
            for t in (start - lead, start, end - lead, end):
                self._at(max(0.0, t), "lease_tick")

    def _lease_for(self, job: Job):
        """The lease of ``job``'s project it runs in, if one holds now and fits it."""
        if job.priority != "on_demand" or not job.gpus:
            return None
        for lease in self.leases.get(job.project, ()):
            start = (lease.starts_at - EPOCH).total_seconds()
            end = (lease.ends_at - EPOCH).total_seconds()
            fits = job.gpus <= lease.gpus and job.gpu_model in ("", lease.gpu_model)
            if fits and start <= self.now_s < end:
                return lease
        return None

    def run(self) -> dict:
        from unittest import mock

        from django.test import override_settings
        from django.utils import timezone

        from compute import placement
        from compute.models import VirtualMachine
        from compute.services import spot
        from controlplane.celery import app

        ids = random.Random(self.seed)
        self._vm_id = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
        wall = time.monotonic()
        with (
            mock.patch.object(timezone, "now", self.now),
            mock.patch.object(app, "send_task", self._capture),
            # The views of the hosts and of the evictable spot VMs age in simulated time,
            # and the scheduler's random start is seeded: a trace replayed twice gives the
            # same figures. One process: its views follow every claim and release it makes,
            # so they are reloaded every ten simulated minutes, and a request that does not
            # fit need not reload them to be sure.
            mock.patch.object(placement, "view_clock", lambda: self.now_s),
            # A VM's id breaks the last ties (of victims equal by every measure): drawn from
            # the seed, the same in every replay of the trace.
            mock.patch.object(VirtualMachine._meta.pk, "_get_default", self._vm_id),
            # An evicted GPU costs the simulated fleet its notice, stop and boot beyond the
            # work it loses: preemption weighs that (``KUMO_SPOT_EVICTION_COST_S``).
            override_settings(
                SPOT_EVICTION_COST_S=float(self.notice_s + self.stop_s + self.boot_s),
                SCHEDULER_VIEW_TTL_S=600.0,
                SCHEDULER_FRESH_AFTER_S=3600.0,
                SCHEDULER_SEED=self.seed,
            ),
            _fresh_views(placement.view, spot.index),
        ):
            self._setup()
            for job in self.jobs:
                self._at(job.submit_s, "submit", job)
            end = self.arrivals_end = max((j.submit_s for j in self.jobs), default=0.0)
            t = self.sample_s
            while t <= end:
                self._at(t, "sample")
                t += self.sample_s
            done = 0
            while self.events:
                t, _seq, kind, data = heapq.heappop(self.events)
                self._advance(t)
                getattr(self, f"_on_{kind}")(*data)
                self._drain()
                if kind == "sample":
                    vacuum_as_autovacuum_would()  # as it would on a running Kumo
                done += kind == "submit"
                self.handled += 1
                if kind == "sample" and int(t) % 86400 < self.sample_s:
                    self.progress(self._so_far(t, done, time.monotonic() - wall))
        return self._figures(time.monotonic() - wall)

    def _so_far(self, t: float, done: int, wall_s: float) -> str:
        """A day's progress line, with the figures so far: a long replay stopped early still
        says what it measured."""
        figures = self._figures(wall_s)
        keys = (
            "goodput_while_spot_waits",
            "spot_waits_days",
            "evictions",
            "evictions_full_notice",
            "on_demand_wait_p99_s",
            "guarantees_honoured",
            "leases_honoured",
            "wall_s",
        )
        return f"day {t / 86400:.0f}: {done} jobs submitted; so far " + ", ".join(
            f"{key} {figures[key]}" for key in keys
        )

    def _after_decisions(self) -> None:
        """Notices given by the last service call: reap each at its deadline."""
        for notice in _NOTICES.tuples():
            # A spot VM evicted, started again and noticed anew has a new deadline.
            if notice not in self.reaps:
                self.reaps.add(notice)
                self._at(max(self.now_s, (notice[1] - EPOCH).total_seconds()), "reap")

    def _on_submit(self, job: Job) -> None:
        from compute import services as compute

        vm, _ = compute.vm_create(
            project=self.projects[job.project],
            name=f"j{job.index}",
            template=self.templates[(job.gpus, job.gpu_model, job.vcpus, job.memory_gib)],
            image=self.image,
            priority=job.priority,
            lease=self._lease_for(job),
        )
        record = _Vm(job=job, vm_id=str(vm.pk))
        self.vms[record.vm_id] = record
        self._wait(record)
        if vm.reserved_host_id:  # it gave spot VMs notice (a spot request never does)
            self._after_decisions()

    def _on_lease_tick(self) -> None:
        from compute import services as compute

        compute.leases_tick(now=self.now())
        compute.vm_schedule_pending(limit=self.schedule_limit)
        self._after_decisions()

    def _on_reap(self) -> None:
        from compute.services import spot

        spot.evictions_reap(now=self.now())

    def _on_end(self, vm_id: str, run: int) -> None:
        from compute import services as compute

        vm = self.vms[vm_id]
        if run != vm.run or not vm.working:
            return  # evicted meanwhile
        self._work_stopped(vm)
        compute.vm_delete(vm=self._guest(vm))  # which locks and reads it

    def _on_checkpoint(self, vm_id: str, run: int, n: int) -> None:
        """The guest saved its work and says so, as through the metadata endpoint."""
        from compute import services as compute

        vm = self.vms[vm_id]
        if run != vm.run or not vm.working:
            return  # stopped meanwhile: its next start counts from its last checkpoint
        compute.checkpoint_report(vm=self._guest(vm))
        self._checkpoint_due(vm, n + 1)

    @staticmethod
    def _guest(vm: _Vm):
        """The job's VM as its guest and its owner name it (its id), made once: what the
        services it calls read and lock themselves."""
        from compute.models import VirtualMachine

        if vm.guest is None:
            vm.guest = VirtualMachine(pk=uuid.UUID(vm.vm_id), name=f"j{vm.job.index}")
        return vm.guest

    def _on_report(
        self, host: str, vm_id: str, generation: int, power: str, operation_id: str
    ) -> None:
        from compute import services as compute
        from compute.choices import VmState

        # As a host agent answers (``compute.host_tasks``): the operation the work was sent
        # for is finished by its report, not left open until the VM is deleted.
        payload = {"vm_id": vm_id, "generation": generation, "power": power, "ok": True}
        vm = compute.vm_observed(
            host=host, payload={**payload, "operation_id": operation_id}, sent_at=self.now()
        )
        record = self.vms.get(vm_id)
        if record is None:
            return
        state = vm.state if vm is not None else None
        if state is None:
            from compute.models import VirtualMachine

            state = VirtualMachine.objects.filter(pk=vm_id).values_list("state", flat=True).first()
        freed = False
        if state == VmState.RUNNING and not record.working and record.claimed:
            self._work_started(record)
        elif state == VmState.DELETED:
            self._released(record)
            freed = True
        elif state == VmState.SHELVED:  # its lease ended: the job ends with it
            self._work_stopped(record)
            self._released(record)
            freed = True
        if record.job.priority == "spot" and record.stop_sent_at is not None:
            freed |= self._evictions_done()  # its eviction's stop: the hand-over may follow
        if freed:
            compute.vm_schedule_pending(limit=self.schedule_limit)
            self._after_decisions()

    def _evictions_done(self) -> bool:
        """Spot VMs the last report evicted: counted, released, and started again."""
        from compute import services as compute
        from compute.choices import VmState
        from compute.models import VirtualMachine

        # Sorted here, not by the database: SQLite would read the whole table in key order
        # rather than sort the few evicted VMs its index on state finds.
        evicted = sorted(
            VirtualMachine.objects.filter(state=VmState.EVICTED, evicted_at=self.now())
            .select_related("project")
            .order_by(),
            key=lambda vm: vm.pk,
        )
        for vm in evicted:
            record = self.vms[str(vm.pk)]
            self.m.evictions += 1
            # Full notice: the notice was the template's, and the stop came at its end.
            noticed = (vm.eviction_deadline - vm.eviction_notice_at).total_seconds()
            deadline = (vm.eviction_deadline - EPOCH).total_seconds()
            stopped = record.stop_sent_at if record.stop_sent_at is not None else -1.0
            if noticed >= self.notice_s and stopped + 1e-6 >= deadline:
                self.m.full_notice += 1
            record.stop_sent_at = None
            self._work_stopped(record)
            self._released(record)
            record.placed_at = None
            compute.vm_start(vm=vm)
            self._wait(record)
        return bool(evicted)

    def _on_sample(self) -> None:
        # Stranded: free GPUs on hosts lacking the vCPUs or memory of one more GPU.
        free = dict(_FREE_GPUS.tuples())
        for pk, vcpus, vused, mem, mused in _HOST_ROOM.tuples():
            if pk in free and (vcpus - vused < 16 or mem - mused < 57 * 1024):
                self.m.stranded += free[pk] * self.sample_s
        # Held by a lease and used by none of its VMs: free, but for the lease's project only.
        idle = len(_LEASE_IDLE.tuples())
        self.m.lease_idle += idle * self.sample_s
        if self._spot_waits():
            self.m.saturated_lease_idle += idle * self.sample_s
        # Guarantees: others' on-demand GPUs never took the guaranteed headroom.
        if self.guarantees:
            ids = {self.projects[s].pk: g for s, g in self.guarantees.items()}
            used = dict(_ON_DEMAND_GPUS.tuples())
            headroom = sum(max(0, g - used.get(p, 0)) for p, g in ids.items())
            taken = sum(used.values())
            self.m.guarantee_samples += 1
            self.m.guarantee_ok += taken + headroom <= self.m.gpus_total
        self._sample_leases()

    def _sample_leases(self) -> None:
        """Every active lease holds all its GPUs."""
        active = _ACTIVE_LEASES.tuples()
        if active:
            self.m.lease_samples += 1
            self.m.lease_ok += all(held >= gpus for gpus, held in active)

    def _figures(self, wall_s: float) -> dict:
        m = self.m
        hours = 3600.0
        capacity = m.gpus_total * m.t / hours
        waits = sorted(m.waits)

        def pct(p):
            return round(waits[max(0, -(-len(waits) * p // 100) - 1)], 1) if waits else 0.0

        work = (m.od_work + m.spot_work) / hours
        lost = m.spot_lost / hours
        days = m.t / 86400
        return {
            "jobs": len(self.jobs),
            "simulated_days": round(days, 3),
            "capacity_gpu_h": round(capacity, 1),
            "on_demand_gpu_h": round(m.od_work / hours, 1),
            "spot_gpu_h": round(m.spot_work / hours, 1),
            "held_idle_gpu_h": round(m.held_idle / hours, 1),
            "free_while_waiting_gpu_h": round(m.free_waiting / hours, 1),
            "free_gpu_h": round(m.free / hours, 1),
            "stranded_gpu_h": round(m.stranded / hours, 1),
            "lease_idle_gpu_h": round(m.lease_idle / hours, 1),
            "goodput": round((work - lost) / capacity, 4) if capacity else 0.0,
            "allocated": round((work + m.held_idle / hours) / capacity, 4) if capacity else 0.0,
            # The target's goodput: over the time waiting spot work exceeded the free GPUs
            # (the ramp-up at the start and the drain at the end are not that time).
            "goodput_while_spot_waits": round(
                (m.saturated_work - m.saturated_lost) / m.saturated_capacity, 4
            )
            if m.saturated_capacity
            else None,
            "spot_waits_days": round(m.saturated / 86400, 3),
            # Where the rest of that time's capacity went: held idle (boots, stops), free
            # (no waiting request fitted: too few on one host or cell), spot work lost.
            "spot_waits_held_idle_gpu_h": round(m.saturated_held / hours, 1),
            "spot_waits_free_gpu_h": round(m.saturated_free / hours, 1),
            "spot_waits_lease_idle_gpu_h": round(m.saturated_lease_idle / hours, 1),
            "spot_waits_lost_gpu_h": round(m.saturated_lost / hours, 1),
            "spot_lost_gpu_h": round(lost, 1),
            "on_demand_wait_p50_s": pct(50),
            "on_demand_wait_p99_s": pct(99),
            "evictions": m.evictions,
            "evictions_full_notice": round(m.full_notice / m.evictions, 4) if m.evictions else 1.0,
            "guarantees_honoured": round(m.guarantee_ok / m.guarantee_samples, 4)
            if m.guarantee_samples
            else None,
            "leases_honoured": round(m.lease_ok / m.lease_samples, 4) if m.lease_samples else None,
            "wall_s": round(wall_s, 1),
            "simulated_days_per_wall_minute": round(days / (wall_s / 60), 2) if wall_s else None,
        }

    def plot(self, path: str) -> None:
        """A PNG of allocated GPUs over time by priority (matplotlib, no display)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        if not self.m.series:
            return
        t = [p[0] / 86400 for p in self.m.series]
        od = [p[1] for p in self.m.series]
        spot = [p[1] + p[2] for p in self.m.series]
        fig, ax = plt.subplots(figsize=(11, 4))
        ax.fill_between(t, 0, od, step="post", label="on-demand", color="#1f77b4")
        ax.fill_between(t, od, spot, step="post", label="spot", color="#ff7f0e")
        ax.axhline(self.m.gpus_total, color="black", lw=0.8, ls="--", label="capacity")
        ax.set_xlabel("simulated day")
        ax.set_ylabel("GPUs doing tenant work")
        ax.set_xlim(0, max(t))
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
