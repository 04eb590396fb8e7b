"""Every write to storage objects: volumes, shares, buckets, access keys, what host agents
report, and the usage intervals billing reads.

Each service runs in one transaction with its audit event. Volume work reaches the host
through the VM it is attached to: attaching, detaching or growing an attached volume bumps
the VM's generation under its row lock and sends the VM's ``vm_apply`` after commit, which
carries its volumes. Share work goes to the host serving the tier, keyed on the share's
generation. Object storage calls the service synchronously: it is one central service,
not a host, and an access key's secret exists only in the answer to its creation. Each
remote call is made before the row it backs is written and undone if the write fails,
so the database never names a bucket or key the service lacks.
"""

import logging
from decimal import Decimal
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from compute.choices import VmState
from compute.models import Host, VirtualMachine
from compute.services.lifecycle import vm_reapply
from controlplane import agents, audit
from controlplane.compiled import Compiled
from controlplane.errors import Conflict, InvalidInput
from network import allocation
from storage import protocol, selectors
from storage.choices import UsageKind, VolumeState, VolumeTier
from storage.drivers.base import GIB, ObjectStoreAdmin, StorageError
from storage.models import AccessKey, Bucket, Share, StorageUsage, Volume
from tenants import quotas
from tenants.models import Project

log = logging.getLogger(__name__)

DEVICES = [f"vd{c}" for c in "bcdefghijklmnopqrstuvwxyz"]  # vda is the root disk
ATTACHABLE = {VmState.PROVISIONING, VmState.RUNNING, VmState.STOPPED}


# --- usage intervals ------------------------------------------------------------------------


def _usage(subject, kind: str, gib, *, at=None) -> None:
    """Close the open interval of (kind, ``subject``) and, unless ``gib`` is None, open the
    next at the same instant. Nothing changes when the size is the same. The same
    interval is billed: ``tenants.usage`` keeps it as GiB of storage."""
    from tenants import usage as billing
    from tenants.choices import UsageResource

    project, object_id = subject.project, subject.pk
    at = at or timezone.now()
    if not gib:  # gone, or empty: nothing to bill
        billing.usage_close(subject, UsageResource.STORAGE, at=at)
    else:
        billing.usage_open(subject, UsageResource.STORAGE, Decimal(gib), at)
    gib = None if gib is None else Decimal(gib).quantize(Decimal("0.001"))
    open_row = (
        StorageUsage.objects.select_for_update()
        .filter(kind=kind, object_id=str(object_id), ended_at__isnull=True)
        .first()
    )
    if open_row is not None:
        if open_row.gib == gib:
            return
        open_row.ended_at = at
        open_row.save(update_fields=["ended_at"])
    if gib is not None:
        StorageUsage.objects.create(
            project=project, kind=kind, object_id=str(object_id), gib=gib, started_at=at
        )


# --- volumes --------------------------------------------------------------------------------


@transaction.atomic
def volume_create(
    *,
    project: Project,
    name: str,
    size_gib: int,
    tier: str = VolumeTier.SHARED,
    description: str = "",
) -> Volume:
    """A volume of ``size_gib``, counted against ``storage_gib`` at once. It is made on a
    host when first attached (the host of that VM)."""
    if Volume.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a volume named {name} exists", details={"name": ["taken"]})
    quotas.check(project, storage_gib=size_gib)
    volume = Volume.objects.create(
        project=project, name=name, size_gib=size_gib, tier=tier, description=description
    )
    _usage(volume, UsageKind.VOLUME, size_gib)
    audit.record(
        "volume.create", volume, project=project, detail={"size_gib": size_gib, "tier": tier}
    )
    return volume


def _locked_vm(vm_id) -> VirtualMachine:
    return (
        VirtualMachine.objects.select_for_update(of=("self",))
        .select_related("host", "project")
        .get(pk=vm_id)
    )


@transaction.atomic
def volume_attach(*, volume: Volume, vm: VirtualMachine) -> Volume:
    """Attach an available volume to a placed VM of its project as its next free disk
    (``vdb`` on). 409 when the volume is attached, the VM is not placed (pending, deleting,
    …), or a local volume lives on another host than the VM. The guest gets the disk with
    the VM's next generation, in its definition and, when it runs, live at once
    (``compute.host_tasks.converge_volumes``): it sees ``/dev/disk/by-id/virtio-<serial>``
    appear without a reboot."""
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    if volume.state != VolumeState.AVAILABLE:
        raise Conflict(
            f"volume {volume.name} is {volume.state}",
            details={"state": [volume.state]},
        )
    vm = _locked_vm(vm.pk)
    if vm.project_id != volume.project_id:
        raise InvalidInput.field("vm", "no such VM in this project")
    if vm.state not in ATTACHABLE or vm.host_id is None:
        raise Conflict(
            f"VM {vm.name} is {vm.state}; volumes attach to placed VMs",
            details={"vm": [vm.state]},
        )
    if volume.tier == VolumeTier.LOCAL and volume.host_id not in (None, vm.host_id):
        raise Conflict(
            f"local volume {volume.name} lives on another host than VM {vm.name}",
            code="wrong_host",
            details={"vm": ["on another host than the local volume"]},
        )
    taken = set(Volume.objects.filter(vm=vm).values_list("device", flat=True))
    free = [d for d in DEVICES if d not in taken]
    if not free:
        raise Conflict(f"VM {vm.name} has no free disk slot", details={"vm": ["full"]})
    volume.vm, volume.device, volume.state = vm, free[0], VolumeState.IN_USE
    volume.host = vm.host
    volume.save(update_fields=["vm", "device", "state", "host", "updated_at"])
    vm_reapply(vm)
    audit.record(
        "volume.attach",
        volume,
        project=volume.project,
        detail={"vm": str(vm.pk), "device": volume.device, "vm_generation": vm.generation},
    )
    return volume


def _detach(volume: Volume) -> None:
    volume.vm, volume.device, volume.state = None, "", VolumeState.AVAILABLE
    volume.save(update_fields=["vm", "device", "state", "updated_at"])


@transaction.atomic
def volume_detach(*, volume: Volume) -> Volume:
    """Detach an attached volume (409 when it is not attached); its VM's next generation
    leaves the disk out, of a running guest at once (the host waits for the guest to
    release it). The data stays in the volume."""
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    if volume.state != VolumeState.IN_USE:
        raise Conflict(f"volume {volume.name} is {volume.state}", details={"state": [volume.state]})
    vm = _locked_vm(volume.vm_id)
    device = volume.device
    _detach(volume)
    vm_reapply(vm)
    audit.record(
        "volume.detach",
        volume,
        project=volume.project,
        detail={"vm": str(vm.pk), "device": device, "vm_generation": vm.generation},
    )
    return volume


# The volumes of a VM being deleted, locked: read by every delete, compiled once.
_VM_VOLUMES_LOCKED = Compiled(
    lambda vm_id: Volume.objects.select_for_update().select_related("project").filter(vm_id=vm_id),
    UUID,
)


def volumes_release(vm: VirtualMachine) -> int:
    """Detach every volume of a VM that is being deleted (inside its transaction): the
    guest goes away, the volumes and their data stay. Returns how many."""
    released = 0
    for volume in _VM_VOLUMES_LOCKED.objects(vm.pk):
        device = volume.device
        _detach(volume)
        audit.record(
            "volume.detach",
            volume,
            project=volume.project,
            detail={"vm": str(vm.pk), "device": device, "reason": "the VM is deleted"},
        )
        released += 1
    return released


@transaction.atomic
def volume_extend(*, volume: Volume, size_gib: int) -> Volume:
    """Grow a volume to ``size_gib`` (400 unless larger; the quota counts the growth). An
    attached volume grows on its host with the VM's next generation, and a running guest
    sees the larger disk at once (a live block resize); a detached one grows when it is
    next attached."""
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    if size_gib <= volume.size_gib:
        raise InvalidInput.field(
            "size_gib", f"must be larger than the volume's {volume.size_gib} GiB"
        )
    quotas.check(volume.project, storage_gib=size_gib - volume.size_gib)
    before = volume.size_gib
    volume.size_gib = size_gib
    volume.save(update_fields=["size_gib", "updated_at"])
    _usage(volume, UsageKind.VOLUME, size_gib)
    if volume.vm_id is not None:
        vm_reapply(_locked_vm(volume.vm_id))
    audit.record(
        "volume.extend", volume, project=volume.project, detail={"from": before, "to": size_gib}
    )
    return volume


@transaction.atomic
def volume_delete(*, volume: Volume) -> None:
    """Delete a detached volume (409 while attached) and, if a host made it, its data
    there."""
    volume = Volume.objects.select_for_update(of=("self",)).select_related("host").get(pk=volume.pk)
    if volume.state == VolumeState.IN_USE:
        raise Conflict(
            f"volume {volume.name} is attached to a VM; detach it first",
            code="in_use",
            details={"state": [volume.state]},
        )
    if volume.host is not None:
        agents.send_to_host(
            volume.host.name,
            protocol.VOLUME_DELETE_TASK,
            pool=protocol.POOLS[volume.tier],
            name=volume.volume_name,
        )
    _usage(volume, UsageKind.VOLUME, None)
    audit.record(
        "volume.delete", volume, project=volume.project, detail={"size_gib": volume.size_gib}
    )
    volume.delete()


# --- shares ---------------------------------------------------------------------------------


def _tier(tier: str) -> dict:
    config = settings.SHARE_TIERS.get(tier)
    if not config:
        raise Conflict(
            f"no file system serves tier {tier} at this site (KUMO_SHARE_{tier.upper()})",
            code="share_unavailable",
            details={"tier": ["not offered at this site"]},
        )
    return config


def _send_share(share: Share, *, present: bool = True) -> None:
    """Send ``share`` whole to its host: present with its limit and exactly its project's
    VMs' addresses as clients (``selectors.share_clients``), or absent."""
    message = protocol.ShareApply(
        share_id=str(share.pk),
        generation=share.generation,
        tier=share.tier,
        name=share.directory,
        project_number=share.project_number,
        quota_gib=share.quota_gib,
        present=present,
        clients=selectors.share_clients(share.project_id) if present else (),
    )
    agents.send_to_host(share.host.name, protocol.SHARE_APPLY_TASK, **message.to_wire())


@transaction.atomic
def share_create(*, project: Project, name: str, tier: str, quota_gib: int) -> Share:
    """A share of ``quota_gib`` on ``tier`` (409 when the site has no such tier), made by
    the host serving the tier after commit; counted against ``storage_gib`` at once. Its
    mount source and point are known at once; guests mount it once the host applied it."""
    config = _tier(tier)
    host = Host.objects.filter(name=config["host"]).first()
    if host is None:
        raise Conflict(
            f"the host serving tier {tier} ({config['host']}) is not enrolled",
            code="share_unavailable",
            details={"tier": ["its host is not enrolled"]},
        )
    if Share.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a share named {name} exists", details={"name": ["taken"]})
    quotas.check(project, storage_gib=quota_gib)
    taken = set(Share.objects.values_list("project_number", flat=True))
    first = settings.SHARE_PROJECT_ID_BASE

    def make(number: int) -> Share:
        share = Share(
            project=project,
            name=name,
            tier=tier,
            backend=config["backend"],
            quota_gib=quota_gib,
            project_number=number,
            host=host,
            mount_point=f"/{tier}/{name}",
        )
        source = config["source"].rstrip("/")
        share.mount_source = f"{source}/{share.directory}"
        share.save()
        return share

    share = allocation.claim(
        (n for n in range(first, first + 10_000_000) if n not in taken),
        make,
        exhausted="no file system project id is free",
    )
    share.project = project
    _usage(share, UsageKind.SHARE, quota_gib)
    audit.record(
        "share.create",
        share,
        project=project,
        detail={"tier": tier, "quota_gib": quota_gib, "project_number": share.project_number},
    )
    _send_share(share)
    return share


@transaction.atomic
def share_extend(*, share: Share, quota_gib: int) -> Share:
    """Raise a share's limit (400 unless larger; the quota counts the growth)."""
    share = Share.objects.select_for_update().select_related("host", "project").get(pk=share.pk)
    if quota_gib <= share.quota_gib:
        raise InvalidInput.field(
            "quota_gib", f"must be larger than the share's {share.quota_gib} GiB"
        )
    quotas.check(share.project, storage_gib=quota_gib - share.quota_gib)
    before = share.quota_gib
    Share.objects.filter(pk=share.pk).update(quota_gib=quota_gib, generation=F("generation") + 1)
    share.refresh_from_db()
    _usage(share, UsageKind.SHARE, quota_gib)
    audit.record(
        "share.extend", share, project=share.project, detail={"from": before, "to": quota_gib}
    )
    _send_share(share)
    return share


@transaction.atomic
def share_delete(*, share: Share) -> None:
    """Delete a share and, on its host, its data."""
    share = Share.objects.select_for_update().select_related("host", "project").get(pk=share.pk)
    share.generation += 1
    _send_share(share, present=False)
    _usage(share, UsageKind.SHARE, None)
    audit.record("share.delete", share, project=share.project, detail={"tier": share.tier})
    share.delete()


@transaction.atomic
def share_reported(*, host: str, payload: dict, sent_at) -> None:
    """A share's host applied a generation (or failed to): record it and the usage read.
    A report for a deleted share, or of a generation older than the one applied, changes
    nothing (a failure among them included); a usage read older than the one recorded is
    not recorded."""
    share = Share.objects.select_for_update().filter(pk=payload.get("share_id")).first()
    if share is None or payload.get("absent"):
        return
    generation = int(payload.get("generation", 0))
    if generation < share.applied_generation:
        return  # delivered again, or overtaken by a newer one: the newer one stands
    if not payload.get("ok"):
        log.warning(
            "share %s (%s) on host %s failed: %s",
            share.pk,
            share.tier,
            host,
            payload.get("detail") or payload.get("error", ""),
        )
        share.last_error = str(payload.get("error", ""))[:500]
        share.save(update_fields=["last_error"])
        return
    share.applied_generation = generation
    share.last_error = ""
    if "used_bytes" in payload and (share.usage_at is None or sent_at >= share.usage_at):
        share.used_bytes = int(payload["used_bytes"])
        share.usage_at = sent_at
    share.save(update_fields=["applied_generation", "last_error", "used_bytes", "usage_at"])


def shares_sync(share_ids=None) -> int:
    """Send every share (or those of ``share_ids``) to its host again (beat,
    ``KUMO_SHARE_SYNC_S``): repairs drift and refreshes usage. Returns how many were sent."""
    sent = 0
    shares = Share.objects.select_related("host", "project")
    if share_ids is not None:
        shares = shares.filter(pk__in=list(share_ids))
    for share in shares:
        with transaction.atomic():
            _send_share(share)
        sent += 1
    return sent


def shares_follow_vms(project_id, address: str | None = None) -> None:
    """Once the transaction commits, send ``project_id``'s shares to their hosts again
    with their clients as they are then: an address of one of its VMs came or went
    (wired to ports and their addresses in ``storage.apps``). The shares of every other
    project with a VM at ``address`` go too (an address two projects hold is exported to
    neither). Beat's ``shares_sync`` repairs anything missed."""
    from network.models import FixedIp

    def send():
        projects = {project_id}
        if address:
            projects |= set(
                FixedIp.objects.filter(address=address, port__vm__isnull=False).values_list(
                    "port__project_id", flat=True
                )
            )
        ids = list(Share.objects.filter(project_id__in=projects).values_list("pk", flat=True))
        if ids:
            shares_sync(ids)

    if project_id is not None:
        transaction.on_commit(send, robust=True)


# --- object storage -------------------------------------------------------------------------


def object_store() -> ObjectStoreAdmin:
    """The configured object store's admin driver (409 when none is configured)."""
    config = settings.OBJECT_STORE
    args = (config["endpoint"], config["access_key"], config["secret_key"], config["region"])
    if config["kind"] == "s3iam":
        from storage.drivers.objectstore import S3IamAdmin

        return S3IamAdmin(*args)
    if config["kind"] == "rgw":
        from storage.drivers.objectstore import RgwAdmin

        return RgwAdmin(*args)
    raise Conflict(
        "object storage is not offered at this site (KUMO_OBJECT_STORE)",
        code="object_storage_unavailable",
        details={"object_store": ["not configured"]},
    )


def store_user(project: Project) -> str:
    """The project's user on the object store."""
    return f"kumo-{project.slug}"


def _unavailable(e: StorageError) -> Conflict:
    return Conflict(
        f"the object store refused: {e}",
        code="object_store_error",
        details={"object_store": [str(e)[:200]]},
    )


def bucket_create(*, project: Project, name: str, quota_gib: int) -> Bucket:
    """A bucket owned by the project's object store user, with a byte quota of
    ``quota_gib`` (counted against ``storage_gib``). Only the project's access keys reach
    it. A name taken anywhere is 409; a refusal by the service is 409 and leaves nothing."""
    store = object_store()
    if Bucket.objects.filter(name=name).exists():
        raise Conflict(f"bucket name {name} is taken", details={"name": ["taken"]})
    with transaction.atomic():  # the quota first: nothing is made beyond it
        quotas.check(project, storage_gib=quota_gib, buckets=1)
    owner = store_user(project)
    try:
        store.ensure_user(owner)
        store.ensure_bucket(name, owner)
        store.set_bucket_quota(name, owner, quota_gib * GIB)
    except StorageError as e:
        raise _unavailable(e) from e
    try:
        with transaction.atomic():
            quotas.check(project, storage_gib=quota_gib, buckets=1)
            bucket = Bucket.objects.create(project=project, name=name, quota_gib=quota_gib)
            _usage(bucket, UsageKind.BUCKET, 0)
            audit.record("bucket.create", bucket, project=project, detail={"quota_gib": quota_gib})
    except Exception:
        store.delete_bucket(name, owner)
        raise
    return bucket


@transaction.atomic
def bucket_update(*, bucket: Bucket, quota_gib: int) -> Bucket:
    """Change a bucket's quota (the project quota counts a rise)."""
    bucket = Bucket.objects.select_for_update().select_related("project").get(pk=bucket.pk)
    if quota_gib > bucket.quota_gib:
        quotas.check(bucket.project, storage_gib=quota_gib - bucket.quota_gib)
    try:
        object_store().set_bucket_quota(bucket.name, store_user(bucket.project), quota_gib * GIB)
    except StorageError as e:
        raise _unavailable(e) from e
    before, bucket.quota_gib = bucket.quota_gib, quota_gib
    bucket.save(update_fields=["quota_gib"])
    audit.record(
        "bucket.update", bucket, project=bucket.project, detail={"from": before, "to": quota_gib}
    )
    return bucket


@transaction.atomic
def bucket_delete(*, bucket: Bucket) -> None:
    """Delete a bucket and every object in it."""
    bucket = Bucket.objects.select_for_update().select_related("project").get(pk=bucket.pk)
    try:
        object_store().delete_bucket(bucket.name, store_user(bucket.project))
    except StorageError as e:
        raise _unavailable(e) from e
    _usage(bucket, UsageKind.BUCKET, None)
    audit.record(
        "bucket.delete", bucket, project=bucket.project, detail={"used_bytes": bucket.used_bytes}
    )
    bucket.delete()


def buckets_measure() -> int:
    """Read every bucket's usage from the service (beat, ``KUMO_BUCKET_USAGE_S``); a change
    of used GiB opens a new usage interval. Returns how many were read."""
    store = object_store()
    measured = 0
    for bucket in Bucket.objects.select_related("project"):
        try:
            used = store.bucket_usage(bucket.name)
        except StorageError as e:
            log.warning("usage of bucket %s not read: %s", bucket.name, e)
            continue
        with transaction.atomic():
            now = timezone.now()
            Bucket.objects.filter(pk=bucket.pk).update(used_bytes=used, usage_at=now)
            _usage(bucket, UsageKind.BUCKET, Decimal(used) / GIB, at=now)
        measured += 1
    return measured


def access_key_create(
    *, project: Project, description: str = "", actor=None
) -> tuple[AccessKey, str]:
    """A new access key of the project's object store user; returns it and its secret,
    which Kumo does not keep."""
    store = object_store()
    owner = store_user(project)
    try:
        store.ensure_user(owner)
        pair = store.create_key(owner)
    except StorageError as e:
        raise _unavailable(e) from e
    try:
        with transaction.atomic():
            key = AccessKey.objects.create(
                project=project,
                access_key_id=pair.access_key_id,
                description=description,
                created_by=actor if getattr(actor, "is_authenticated", False) else None,
            )
            audit.record("accesskey.create", key, project=project)
    except Exception:
        store.delete_key(owner, pair.access_key_id)
        raise
    return key, pair.secret_access_key


@transaction.atomic
def access_key_delete(*, key: AccessKey) -> None:
    """Revoke an access key at the service and forget it."""
    key = AccessKey.objects.select_for_update().select_related("project").get(pk=key.pk)
    try:
        object_store().delete_key(store_user(key.project), key.access_key_id)
    except StorageError as e:
        raise _unavailable(e) from e
    audit.record("accesskey.delete", key, project=key.project)
    key.delete()
