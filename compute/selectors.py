"""Reads of compute data that other code shares."""

from django.db.models import Count, Q, Sum

from compute.choices import DeviceKind, VmState
from compute.models import Host, VirtualMachine

HOLDING = [
    VmState.PROVISIONING,
    VmState.RUNNING,
    VmState.STOPPED,
    VmState.DELETING,
    VmState.ERROR,
    VmState.EVICTING,
]


def host_usage_drift() -> list[dict]:
    """Hosts whose claim counters differ from the VMs placed on them (should be none: the
    counters move only with a claim or a release, in the VM's own transaction)."""
    placed = {
        row["host_id"]: row
        for row in VirtualMachine.objects.filter(host__isnull=False, state__in=HOLDING)
        .values("host_id")
        .annotate(vcpus=Sum("vcpus"), memory=Sum("memory_mib"))
    }
    drift = []
    for host in Host.objects.values("id", "name", "vcpus_used", "memory_mib_used"):
        row = placed.get(host["id"], {"vcpus": 0, "memory": 0})
        if (host["vcpus_used"], host["memory_mib_used"]) != (row["vcpus"], row["memory"]):
            drift.append({**host, "placed_vcpus": row["vcpus"], "placed_memory": row["memory"]})
    return drift


def gpu_allocation_errors() -> list[str]:
    """VMs holding another number of GPUs than they asked for, or 1-4 GPUs across cells."""
    errors = []
    rows = (
        VirtualMachine.objects.filter(state__in=HOLDING)
        .annotate(
            held=Count("devices", filter=Q(devices__kind=DeviceKind.GPU)),
            cells=Count("devices__numa_node", distinct=True),
        )
        .values_list("pk", "gpus", "held", "cells")
    )
    for pk, gpus, held, cells in rows:
        if gpus != held:
            errors.append(f"vm {pk} asked for {gpus} GPUs and holds {held}")
        elif 0 < gpus <= 4 and cells != 1:
            errors.append(f"vm {pk} holds {gpus} GPUs across {cells} NUMA cells")
    return errors
