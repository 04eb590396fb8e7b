"""Quota usage and the atomic quota check.

Usage is counted from what exists: each app registers, per quota resource, a function that
counts a project's use (compute counts VMs, vCPUs, memory and GPUs; network counts networks
and global IPs; storage counts GiB and buckets). Nothing stores a running total, so nothing
can drift.

``check()`` is the claim point: called inside the transaction that creates the object, it
locks the project's quota row first, so two concurrent creates in one project queue behind
each other and the second one counts the first.
"""

from collections.abc import Callable

from django.db import transaction

from controlplane.compiled import Compiled
from controlplane.errors import QuotaExceeded
from tenants.models import Project, Quota

UsageCounter = Callable[[Project], int]
UsageCounts = Callable[[Project], dict[str, int]]
_counters: dict[str, list[UsageCounter]] = {name: [] for name in Quota.RESOURCES}
# Each group with the resources it counts (``None``: not said, so always asked).
_count_groups: list[tuple[UsageCounts, frozenset[str] | None]] = []


def register_usage(resource: str, counter: UsageCounter) -> None:
    """Register ``counter(project) -> int`` as a part of ``resource``'s usage."""
    if resource not in _counters:
        raise ValueError(f"unknown quota resource {resource!r}; known: {', '.join(_counters)}")
    if counter not in _counters[resource]:
        _counters[resource].append(counter)


def register_usage_counts(counter: UsageCounts, resources: tuple[str, ...] = ()) -> None:
    """Register ``counter(project) -> {resource: int}``: several resources counted in one
    go (compute counts VMs, vCPUs, memory and GPUs in one aggregate query). ``resources``
    names what it counts, so a check of other resources never runs it."""
    if any(counter is known for known, _ in _count_groups):
        return
    _count_groups.append((counter, frozenset(resources) or None))


def usage(project: Project, resources=None) -> dict[str, int]:
    """What the project uses now, per quota resource; with ``resources``, only those are
    sure to be counted (a check counts what it is asked for, nothing more)."""
    wanted = set(resources) if resources is not None else set(_counters)
    totals = {
        name: sum(count(project) for count in counters) if name in wanted else 0
        for name, counters in _counters.items()
    }
    for counter, counts in _count_groups:
        if counts is not None and not counts & wanted:
            continue
        for name, value in counter(project).items():
            if name not in totals:
                raise ValueError(f"{counter.__qualname__} counts unknown quota resource {name!r}")
            totals[name] += value
    return totals


# ``check``'s lock of the project's quota, compiled once: every create takes it.
_QUOTA_LOCKED = Compiled(
    lambda project_id: Quota.objects.select_for_update().filter(project_id=project_id), int
)


def check(project: Project, **requested: int) -> Quota:
    """Lock the project's quota and raise QuotaExceeded unless ``requested`` fits.

    Must run inside the transaction that then creates the objects; returns the locked quota.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("quotas.check() must run inside the creating transaction")
    found = _QUOTA_LOCKED.objects(project.pk)
    if not found:
        raise Quota.DoesNotExist("Quota matching query does not exist.")
    quota = found[0]
    in_use = usage(project, requested)
    for resource, amount in requested.items():
        limit = getattr(quota, resource)
        if in_use[resource] + amount > limit:
            raise QuotaExceeded(
                f"quota exceeded for {resource}: limit {limit}, in use {in_use[resource]}, "
                f"requested {amount}",
                details={
                    resource: [f"limit {limit}, in use {in_use[resource]}, requested {amount}"]
                },
            )
    return quota
