"""Resource reclamation (mdx's): VMs of projects past their end date, idle VMs, and VMs of
projects over a budget that stops them.

Every step is announced before it happens, with the time it will happen (an event,
``vm.reclaim_scheduled``, listed in the project's events, sent to its webhooks and mailed to
its admins), recorded in the audit log when announced and when done, and kept on the VM
(``reclaim_action``, ``reclaim_reason``, ``reclaim_at``) so a restarted controller carries
on. Beat runs ``reclaim_run`` every ``KUMO_RECLAIM_INTERVAL_S``; the project reads the
thresholds and its scheduled steps at ``/api/v1/projects/{slug}/reclamation/``.

Where this says "stopped", the VM is shelved (``compute.services.shelve``): its guest stops,
its root disk is kept and every claim (GPUs, vCPUs, memory, host) is released, so the
capacity returns to others; its owner unshelves it to run again.

- **A project past its end date** (status ``expired``, set by ``tenants.projects_expire``):
  each running VM is stopped ``KUMO_RECLAIM_EXPIRED_NOTICE_S`` after the announcement, then
  deleted ``KUMO_RECLAIM_EXPIRED_GRACE_S`` after it stopped; a VM not running is only
  deleted, after the same grace. Renewing the project (active again) cancels what is
  scheduled.
- **An idle VM**: running for ``KUMO_IDLE_AFTER_S`` with its CPU use never reaching
  ``KUMO_IDLE_CPU_PERCENT`` of its vCPUs between two guests reports is warned, then stopped
  ``KUMO_IDLE_WARNING_S`` later unless it was busy meanwhile. CPU time is what the host
  reads from libvirt; GPU use inside a passthrough guest is invisible to the host, so a GPU
  job that keeps its CPUs below the threshold looks idle (keep the threshold low).
- **A project over its budget** (``tenants.billing.budgets_check``, for a budget whose
  policy is ``stop_spot`` or ``stop_all``): ``budget_reclaim`` stops its running spot VMs,
  then, with ``stop_all``, the others, each step announced (``budget.reclaim``) and audited
  just before, not ahead of time.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from compute.choices import Priority, ReclaimAction, ReclaimReason, VmState, VmTask
from compute.models import CapacityGuarantee, VirtualMachine
from compute.services.shelve import vm_shelve
from compute.services.vms import vm_delete
from controlplane import audit, events
from controlplane.errors import Conflict, NotFound
from tenants.choices import BudgetPolicy, ProjectStatus
from tenants.models import Budget

log = logging.getLogger(__name__)

GONE = [VmState.DELETING, VmState.DELETED]


# --- idleness, from the guests report ----------------------------------------------------------


def cpu_observed(vm: VirtualMachine, cpu_time_ns: int | None, now: datetime) -> dict:
    """The fields that follow from the host reading ``cpu_time_ns`` of ``vm``'s guest now:
    the sample, and ``active_at`` when the CPU use since the last sample reached
    ``KUMO_IDLE_CPU_PERCENT`` of its vCPUs (or when there is no earlier sample to compare:
    a first sample, a restarted guest whose counter went back)."""
    if cpu_time_ns is None:
        return {}
    changes: dict = {"cpu_time_ns": int(cpu_time_ns), "cpu_sampled_at": now}
    previous, at = vm.cpu_time_ns, vm.cpu_sampled_at
    if previous is None or at is None or cpu_time_ns < previous:
        changes["active_at"] = now
        return changes
    wall = (now - at).total_seconds()
    if wall <= 0:
        return {}
    busy = (cpu_time_ns - previous) / 1e9 / wall / max(vm.vcpus, 1) * 100
    if busy >= settings.IDLE_CPU_PERCENT:
        changes["active_at"] = now
    return changes


# --- announcing and doing ----------------------------------------------------------------------


def _announce(vm: VirtualMachine, action: str, reason: str, at: datetime, now: datetime) -> None:
    VirtualMachine.objects.filter(pk=vm.pk).update(
        reclaim_action=action, reclaim_reason=reason, reclaim_at=at, reclaim_noticed_at=now
    )
    vm.reclaim_action, vm.reclaim_reason, vm.reclaim_at = action, reason, at
    vm.reclaim_noticed_at = now
    why = {
        ReclaimReason.PROJECT_EXPIRED: f"project {vm.project.slug} is past its end date",
        ReclaimReason.IDLE: f"it has used no CPU for {settings.IDLE_AFTER_S} s",
    }[reason]
    detail = {"action": action, "reason": reason, "at": at.isoformat()}
    audit.record("vm.reclaim_scheduled", vm, project=vm.project, detail=detail)
    kind = "vm.idle_warning" if reason == ReclaimReason.IDLE else "vm.reclaim_scheduled"
    events.emit(
        kind,
        project=vm.project,
        message=f"vm {vm.name} will be {action_verb(action)} at {at.isoformat()}: {why}",
        obj=vm,
        payload={**detail, "vm": str(vm.pk)},
        mail=True,
    )


def action_verb(action: str) -> str:
    return {"stop": "stopped", "delete": "deleted"}.get(action, action)


def _clear(vm: VirtualMachine, *, why: str, now: datetime, announce: bool) -> None:
    detail = {"action": vm.reclaim_action, "reason": vm.reclaim_reason, "why": why}
    VirtualMachine.objects.filter(pk=vm.pk).update(
        reclaim_action=ReclaimAction.NONE,
        reclaim_reason=ReclaimReason.NONE,
        reclaim_at=None,
        reclaim_noticed_at=None,
    )
    if announce:
        audit.record("vm.reclaim_cancelled", vm, project=vm.project, detail=detail)
        events.emit(
            "vm.reclaim_cancelled",
            project=vm.project,
            message=f"vm {vm.name}: the scheduled {vm.reclaim_action} is cancelled ({why})",
            obj=vm,
            payload={**detail, "vm": str(vm.pk)},
        )
    vm.reclaim_action, vm.reclaim_reason, vm.reclaim_at = "", "", None


def _done(vm: VirtualMachine, action: str, reason: str) -> None:
    audit.record(
        "vm.reclaimed", vm, project=vm.project, detail={"action": action, "reason": reason}
    )
    events.emit(
        "vm.reclaimed",
        project=vm.project,
        message=f"vm {vm.name} was {action_verb(action)} by reclamation ({reason})",
        obj=vm,
        payload={"action": action, "reason": reason, "vm": str(vm.pk)},
    )


def _step(vm: VirtualMachine, now: datetime) -> str | None:
    """Advance one VM's reclamation by what is due now; returns what was done."""
    expired = vm.project.status == ProjectStatus.EXPIRED
    grace = timedelta(seconds=settings.RECLAIM_EXPIRED_GRACE_S)
    if vm.reclaim_reason == ReclaimReason.PROJECT_EXPIRED and not expired:
        _clear(vm, why=f"project {vm.project.slug} is {vm.project.status}", now=now, announce=True)
        return "cancelled"
    if expired and vm.reclaim_reason != ReclaimReason.PROJECT_EXPIRED:
        if vm.reclaim_reason:
            _clear(vm, why="the project expired", now=now, announce=False)
        if vm.state == VmState.RUNNING:
            notice = timedelta(seconds=settings.RECLAIM_EXPIRED_NOTICE_S)
            _announce(vm, ReclaimAction.STOP, ReclaimReason.PROJECT_EXPIRED, now + notice, now)
        else:
            _announce(vm, ReclaimAction.DELETE, ReclaimReason.PROJECT_EXPIRED, now + grace, now)
        return "announced"
    if vm.reclaim_reason == ReclaimReason.IDLE:
        if vm.state != VmState.RUNNING:
            _clear(vm, why=f"it is {vm.state}", now=now, announce=False)
            return "cleared"
        if vm.active_at and vm.reclaim_noticed_at and vm.active_at > vm.reclaim_noticed_at:
            _clear(vm, why="it used CPU again", now=now, announce=True)
            return "cancelled"
    if not vm.reclaim_action or vm.reclaim_at is None or vm.reclaim_at > now:
        return None
    if vm.reclaim_action == ReclaimAction.STOP:
        if vm.state == VmState.RUNNING and not vm.task_state:
            # Shelved, not only stopped: its GPUs, vCPUs and memory really return.
            reason = vm.reclaim_reason
            vm_shelve(vm=vm)
            vm.reclaim_reason = reason
            _done(vm, ReclaimAction.STOP, reason)
        elif vm.state == VmState.RUNNING:
            return None  # an action in flight: next pass
        if vm.reclaim_reason == ReclaimReason.PROJECT_EXPIRED:
            _announce(vm, ReclaimAction.DELETE, ReclaimReason.PROJECT_EXPIRED, now + grace, now)
        else:
            _clear(vm, why="done", now=now, announce=False)
        return "stopped"
    vm_delete(vm=vm)
    _done(vm, ReclaimAction.DELETE, vm.reclaim_reason)
    return "deleted"


def reclaim_run(*, now: datetime | None = None, limit: int = 500) -> dict[str, int]:
    """One pass of reclamation over the VMs it concerns (each in its own transaction, so
    one refusal holds up no other); returns how many VMs each outcome met."""
    now = now or timezone.now()
    concerned = Q(project__status=ProjectStatus.EXPIRED) | ~Q(reclaim_action=ReclaimAction.NONE)
    if settings.IDLE_AFTER_S > 0:
        idle_since = now - timedelta(seconds=settings.IDLE_AFTER_S)
        concerned |= Q(
            state=VmState.RUNNING,
            task_state=VmTask.NONE,
            reclaim_action=ReclaimAction.NONE,
            project__status=ProjectStatus.ACTIVE,
            last_active__lt=idle_since,
        )
    ids = (
        VirtualMachine.objects.annotate(last_active=Coalesce("active_at", "launched_at"))
        .filter(concerned)
        .exclude(state__in=GONE)
        .order_by("reclaim_at", "created_at")
        .values_list("pk", flat=True)[:limit]
    )
    outcomes: dict[str, int] = {}
    for pk in list(ids):
        try:
            with transaction.atomic():
                vm = (
                    VirtualMachine.objects.select_for_update(of=("self",), skip_locked=True)
                    .select_related("project", "host", "image")
                    .filter(pk=pk)
                    .exclude(state__in=GONE)
                    .first()
                )
                if vm is None:
                    continue
                done = _step(vm, now)
                if done is None and _idle(vm, now):
                    warning = timedelta(seconds=settings.IDLE_WARNING_S)
                    _announce(vm, ReclaimAction.STOP, ReclaimReason.IDLE, now + warning, now)
                    done = "warned"
        except Conflict as e:
            log.info("vm %s: reclamation step refused (%s); next pass", pk, e)
            done = "refused"
        if done:
            outcomes[done] = outcomes.get(done, 0) + 1
    return outcomes


def _idle(vm: VirtualMachine, now: datetime) -> bool:
    if settings.IDLE_AFTER_S <= 0 or vm.reclaim_action or vm.state != VmState.RUNNING:
        return False
    if vm.task_state or vm.project.status != ProjectStatus.ACTIVE:
        return False
    last = vm.active_at or vm.launched_at
    return last is not None and last < now - timedelta(seconds=settings.IDLE_AFTER_S)


# --- over-budget projects ----------------------------------------------------------------------


def budget_reclaim(*, budget: Budget, spent: Decimal) -> list[str]:
    """Stop the running VMs of ``budget``'s project as its policy says: spot VMs first,
    then (``stop_all``) the rest. Stopping here is shelving (``compute.services.shelve``):
    a stopped VM would keep its GPUs and bill them at the held price. Each step is
    announced by a ``budget.reclaim`` event and audited, in its own transaction, before
    its VMs are stopped; returns the VM ids. Billing decides when (``budgets_check``);
    compute does the VM writes."""
    steps = [("spot", {"priority": Priority.SPOT})]
    if budget.policy == BudgetPolicy.STOP_ALL:
        steps.append(("on_demand", {}))
    stopped = []
    for step, filters in steps:
        vms = list(
            VirtualMachine.objects.for_project(budget.project)
            .filter(state=VmState.RUNNING, task_state=VmTask.NONE, **filters)
            .select_related("project", "host")
            .order_by("created_at")
        )
        if not vms:
            continue
        names = [vm.name for vm in vms]
        with transaction.atomic():
            message = (
                f"project {budget.project.slug} is over its budget {budget.name!r} "
                f"({spent} of {budget.amount}): stopping {len(vms)} {step} VM(s): "
                + ", ".join(names)
            )
            events.emit(
                "budget.reclaim",
                project=budget.project,
                message=message,
                obj=budget,
                payload={"budget": budget.name, "step": step, "vms": names, "spent": str(spent)},
                mail=True,
            )
            audit.record(
                "budget.reclaim",
                budget,
                project=budget.project,
                detail={"step": step, "vms": [str(vm.pk) for vm in vms], "spent": str(spent)},
            )
        for vm in vms:
            try:
                vm_shelve(vm=vm)  # every claim returns, not only the guest's power
            except (Conflict, NotFound) as e:  # it changed meanwhile: nothing to stop
                log.info("budget %s: vm %s not stopped: %s", budget.pk, vm.pk, e)
                continue
            stopped.append(str(vm.pk))
    return stopped


# --- what the project sees ---------------------------------------------------------------------


def thresholds() -> dict:
    """The reclamation and spot settings in force, as a project reads them."""
    return {
        "idle_after_s": settings.IDLE_AFTER_S,
        "idle_cpu_percent": settings.IDLE_CPU_PERCENT,
        "idle_warning_s": settings.IDLE_WARNING_S,
        "expired_stop_notice_s": settings.RECLAIM_EXPIRED_NOTICE_S,
        "expired_delete_grace_s": settings.RECLAIM_EXPIRED_GRACE_S,
        "spot_stop_grace_s": settings.SPOT_STOP_GRACE_S,
        "spot_eviction_cost_s": settings.SPOT_EVICTION_COST_S,
        "spot_notice_stretch_s": settings.SPOT_NOTICE_STRETCH_S,
    }


def reclamation_report(project) -> dict:
    """``project``'s guaranteed minimum, the thresholds, and its scheduled steps."""
    guarantee = CapacityGuarantee.objects.filter(project=project).first()
    scheduled = (
        VirtualMachine.objects.for_project(project)
        .exclude(reclaim_action=ReclaimAction.NONE)
        .exclude(state__in=GONE)
        .order_by("reclaim_at")
        .values("pk", "name", "reclaim_action", "reclaim_reason", "reclaim_at")
    )
    return {
        "project_status": project.status,
        "valid_until": project.valid_until,
        "min_gpus": guarantee.min_gpus if guarantee else 0,
        "thresholds": thresholds(),
        "scheduled": [
            {
                "vm": row["pk"],
                "name": row["name"],
                "action": row["reclaim_action"],
                "reason": row["reclaim_reason"],
                "at": row["reclaim_at"],
            }
            for row in scheduled
        ],
    }
