"""Compute's part of project quotas: VMs, vCPUs, memory and GPUs, counted from the VMs
that exist (every state but deleted, evicted and shelved holds its share)."""

from django.db.models import Count, Sum

from compute.choices import VmState
from compute.models import VirtualMachine
from tenants import quotas

RELEASED = [VmState.DELETED, VmState.EVICTED, VmState.SHELVED]
# Named rather than excluded, so that the (project, state) index reads only the VMs that
# hold something: a project's years of deleted VMs cost its quota check nothing.
HOLDING = [state for state in VmState.values if state not in RELEASED]


def _usage(project) -> dict[str, int]:
    totals = (
        VirtualMachine.objects.for_project(project)
        .filter(state__in=HOLDING)
        .aggregate(vms=Count("pk"), vcpus=Sum("vcpus"), memory=Sum("memory_mib"), gpus=Sum("gpus"))
    )
    return {
        "vms": totals["vms"] or 0,
        "vcpus": totals["vcpus"] or 0,
        "memory_gib": -(-(totals["memory"] or 0) // 1024),
        "gpus": totals["gpus"] or 0,
    }


def register() -> None:
    quotas.register_usage_counts(_usage, ("vms", "vcpus", "memory_gib", "gpus"))
