"""Compute's part of project quotas: VMs, vCPUs, memory and GPUs, counted from the VMs
that exist (every state but deleted, evicted and shelved holds its share)."""

from django.db.models import Count, Sum

from compute.choices import VmState
from compute.models import VirtualMachine
from controlplane.compiled import Compiled
from tenants import quotas

RELEASED = [VmState.DELETED, VmState.EVICTED, VmState.SHELVED]
# Named rather than excluded, so that the (project, state) index reads only the VMs that
# hold something: a project's years of deleted VMs cost its quota check nothing.
HOLDING = [state for state in VmState.values if state not in RELEASED]


# The project's VMs that hold their share, summed: one row, or none when it has none.
# Compiled once: every create and every start of an evicted or shelved VM counts them.
_HOLDING = Compiled(
    lambda project_id: (
        VirtualMachine.objects.for_project(project_id)
        .filter(state__in=HOLDING)
        .order_by()
        .values("project_id")
        .annotate(vms=Count("pk"), vcpus=Sum("vcpus"), memory=Sum("memory_mib"), gpus=Sum("gpus"))
        .values_list("vms", "vcpus", "memory", "gpus")
    ),
    int,
)


def _usage(project) -> dict[str, int]:
    vms, vcpus, memory, gpus = (_HOLDING.tuples(project.pk) or [(0, 0, 0, 0)])[0]
    return {"vms": vms, "vcpus": vcpus, "memory_gib": -(-memory // 1024), "gpus": gpus}


def register() -> None:
    quotas.register_usage_counts(_usage, ("vms", "vcpus", "memory_gib", "gpus"))
