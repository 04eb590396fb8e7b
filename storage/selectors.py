"""Reads of storage objects that other apps need: a guest's volumes and mounts (compute's
``vm_apply``) and each project's storage use over a period (billing)."""

from datetime import datetime
from decimal import Decimal
from uuid import UUID

from django.db.models import DurationField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce, Greatest, Least

from compute.protocol import MountWire, VolumeWire
from controlplane.compiled import Compiled
from storage.choices import ShareBackend
from storage.models import Share, StorageUsage, Volume
from storage.protocol import POOLS

FSTYPES = {ShareBackend.LUSTRE: "lustre", ShareBackend.NFS: "nfs"}


# Every message to a host about a guest reads its volumes and mounts: compiled once
# (``controlplane.compiled``), not built and compiled by the ORM for each message.
_VOLUMES = Compiled(lambda vm_id: Volume.objects.filter(vm_id=vm_id).order_by("device"), UUID)
_MOUNTED = Compiled(
    lambda project_id: (
        Share.objects.for_project(project_id)
        .filter(applied_generation__gte=F("generation"))
        .order_by("mount_point")
    ),
    int,
)


def vm_volumes(vm) -> tuple[VolumeWire, ...]:
    """The volumes attached to ``vm``, in device order; none, without a read, for a VM
    whose volumes are held prefetched and are none (one made in this transaction)."""
    held = getattr(vm, "_prefetched_objects_cache", {}).get("volumes")
    if held is not None and not held:
        return ()
    return tuple(
        VolumeWire(
            volume_id=str(v.pk),
            pool=POOLS[v.tier],
            name=v.volume_name,
            size_gib=v.size_gib,
            device=v.device,
            serial=v.serial,
        )
        for v in _VOLUMES.objects(vm.pk)
    )


def vm_mounts(vm) -> tuple[MountWire, ...]:
    """Every share of ``vm``'s project that its host has applied, mounted at its mount
    point (a share made later reaches running guests through its mount instructions)."""
    return tuple(
        MountWire(source=s.mount_source, mount_point=s.mount_point, fstype=FSTYPES[s.backend])
        for s in _MOUNTED.objects(vm.project_id)
    )


def mount_command(share: Share) -> str:
    """What a guest runs to mount ``share`` by hand (guests made after the share is ready
    mount it at boot through cloud-init): the API's and the portal's words alike."""
    fstype = FSTYPES[share.backend]
    return (
        f"mkdir -p {share.mount_point} && mount -t {fstype} {share.mount_source} "
        f"{share.mount_point}"
    )


def share_clients(project_id) -> tuple[str, ...]:
    """The addresses that may reach ``project_id``'s shares: every address of a port of one
    of its VMs (not deleted), on the storage path as the VMs are addressed there. An
    address a VM of another project holds too (tenant networks may overlap) names no one
    project, so it is left out: a share is never exported to an address that could be
    another project's."""
    from compute.choices import VmState
    from network.models import FixedIp

    live = FixedIp.objects.filter(port__vm__isnull=False).exclude(port__vm__state=VmState.DELETED)
    own = set(live.filter(port__vm__project_id=project_id).values_list("address", flat=True))
    if not own:
        return ()
    others = set(
        live.filter(address__in=own)
        .exclude(port__vm__project_id=project_id)
        .values_list("address", flat=True)
    )
    return tuple(sorted(own - others, key=lambda a: tuple(int(o) for o in a.split("."))))


def gib_hours(start: datetime, end: datetime, *, project=None) -> dict[int, dict[str, Decimal]]:
    """GiB-hours of each kind (``volume``, ``share``, ``bucket``) each project held between
    ``start`` and ``end``, from the usage intervals clipped to the period, in one query:
    ``{project_id: {kind: gib_hours}}``. Projects with nothing in the period are left out."""
    rows = StorageUsage.objects.filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=start), started_at__lt=end
    )
    if project is not None:
        rows = rows.for_project(project)
    held = ExpressionWrapper(
        Least(Coalesce(F("ended_at"), Value(end)), Value(end))
        - Greatest(F("started_at"), Value(start)),
        output_field=DurationField(),
    )
    totals: dict[int, dict[str, Decimal]] = {}
    for row in rows.values("project_id", "kind", "gib", "started_at", "ended_at").annotate(
        held=held
    ):
        seconds = Decimal(row["held"].total_seconds())
        hours = (row["gib"] * seconds / Decimal(3600)).quantize(Decimal("0.001"))
        kinds = totals.setdefault(row["project_id"], {})
        kinds[row["kind"]] = kinds.get(row["kind"], Decimal(0)) + hours
    return totals
