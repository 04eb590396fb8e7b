"""The storage side of the host agent. No Django here.

- Volumes: before a guest is defined, ``prepare_volumes`` makes (or grows) each volume it
  attaches in this host's pool and returns the disks; a volume no VM holds any more is
  deleted by ``volume_delete``. Both are idempotent on the volume's name (``vol-<id>``).
- Shares: ``share_apply`` converges one share on the tier this host serves and reports
  its usage; a generation older than the one applied changes nothing.

Pools and share tiers come from the agent's environment: ``KUMO_STORAGE_POOLS``
(``kumo-local=dir:/var/lib/kumo/volumes,kumo-shared=logical:vg_shared``; a pool left out
is a ``dir`` pool under ``KUMO_VAR_DIR/pools``) and ``KUMO_SHARES``
(``fast=lustre:/fast,large=nfs:/srv/kumo/large``), with ``KUMO_NFS_SERVER`` (``kernel``, the
default, or ``ganesha``), ``KUMO_NFS_EXPORTS_FILE`` and ``KUMO_NFS_GANESHA_PIDFILE`` for the
NFS driver; ``KUMO_LUSTRE_LCTL`` (``lctl``, a command that reaches the MGS),
``KUMO_LUSTRE_LNET`` (``tcp``) and ``KUMO_LUSTRE_FILESET_PREFIX`` for Lustre nodemaps. Each
share is reachable only from the addresses its ``share_apply`` lists (its project's VMs).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from celery import shared_task

from compute.drivers.base import DiskSpec
from compute.protocol import VolumeWire
from controlplane.agent import reports, runtime
from storage import protocol
from storage.drivers.base import (
    PoolDriver,
    PoolSpec,
    ShareDriver,
    ShareSpec,
    StorageError,
    VolumeSpec,
)

log = logging.getLogger(__name__)

_lock = threading.Lock()
_pool_drivers: dict[int, PoolDriver] = {}
_share_generations: dict[str, int] = {}


def parse_pools(text: str, var_dir: Path) -> dict[str, PoolSpec]:
    """``name=kind:target_or_vg,…`` into pool specs; every tier's pool has one (a dir
    pool under ``var_dir/pools`` unless named)."""
    pools = {
        name: PoolSpec(name=name, kind="dir", target=str(var_dir / "pools" / name))
        for name in protocol.POOLS.values()
    }
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, rest = item.partition("=")
        kind, _, where = rest.partition(":")
        if kind == "logical":
            pools[name] = PoolSpec(name=name, kind=kind, source=where, target=f"/dev/{where}")
        else:
            pools[name] = PoolSpec(name=name, kind=kind, target=where)
    return pools


def parse_shares(text: str) -> dict[str, tuple[str, str]]:
    """``tier=backend:root,…`` into {tier: (backend, root)}."""
    shares = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        tier, _, rest = item.partition("=")
        backend, _, root = rest.partition(":")
        if backend not in ("lustre", "nfs") or not root:
            raise ValueError(f"KUMO_SHARES entry {item!r}: want tier=lustre:/root or nfs:/root")
        shares[tier] = (backend, root)
    return shares


def pool_driver(hv) -> PoolDriver:
    """The pool driver on ``hv``'s own libvirt connection (the compute fake gets an
    in-memory one), one per hypervisor driver."""
    with _lock:
        if id(hv) not in _pool_drivers:
            if hasattr(hv, "connection"):
                from storage.drivers.pools import LibvirtPoolDriver

                _pool_drivers[id(hv)] = LibvirtPoolDriver(hv.connection, simulated=hv.simulated)
            else:
                from storage.drivers.fake import FakePoolDriver

                _pool_drivers[id(hv)] = FakePoolDriver()
        return _pool_drivers[id(hv)]


def _pools() -> dict[str, PoolSpec]:
    config = runtime.config()
    return parse_pools(os.environ.get("KUMO_STORAGE_POOLS", ""), config.var_dir)


def prepare_volumes(volumes: tuple[VolumeWire, ...], hv) -> tuple[DiskSpec, ...]:
    """Make or grow every volume in ``volumes`` in this host's pools; return their disks
    (raw, by pool and volume name, with the volume's serial). Raises StorageError."""
    if not volumes:
        return ()
    pools = _pools()
    driver = pool_driver(hv)
    disks = []
    for wire in volumes:
        if wire.pool not in pools:
            raise StorageError(f"no storage pool {wire.pool} is configured on this host")
        driver.ensure_pool(pools[wire.pool])
        driver.ensure_volume(VolumeSpec(pool=wire.pool, name=wire.name, capacity_gib=wire.size_gib))
        disks.append(
            DiskSpec(
                source=wire.name,
                pool=wire.pool,
                target_dev=wire.device,
                format="raw",
                serial=wire.serial,
                size_bytes=wire.size_gib << 30,
            )
        )
    return tuple(disks)


@shared_task(name=protocol.VOLUME_DELETE_TASK, acks_late=True, time_limit=300, ignore_result=True)
def volume_delete(*, pool: str, name: str) -> None:
    """Delete volume ``name`` of ``pool`` on this host; a missing one is success."""
    try:
        pool_driver(runtime.hypervisor()).ensure_volume_absent(pool, name)
    except StorageError as e:
        log.warning("volume %s/%s not deleted: %s", pool, name, e)
        return
    log.info("volume %s/%s deleted", pool, name)


def share_driver(tier: str) -> ShareDriver:
    """The driver of ``tier`` as this host serves it (``KUMO_SHARES``)."""
    env = os.environ
    backend, root = parse_shares(env.get("KUMO_SHARES", "")).get(tier, ("", ""))
    if backend == "lustre":
        from storage.drivers.lustre import LustreShareDriver

        return LustreShareDriver(
            root,
            lctl=env.get("KUMO_LUSTRE_LCTL", "lctl"),
            lnet=env.get("KUMO_LUSTRE_LNET", "tcp"),
            fileset_prefix=env.get("KUMO_LUSTRE_FILESET_PREFIX", ""),
        )
    if backend == "nfs":
        from storage.drivers.nfs import NfsShareDriver

        server = env.get("KUMO_NFS_SERVER", "kernel")
        default_file = (
            "/etc/ganesha/kumo-exports.conf"
            if server == "ganesha"
            else "/etc/exports.d/kumo.exports"
        )
        return NfsShareDriver(
            root,
            exports_file=env.get("KUMO_NFS_EXPORTS_FILE", default_file),
            server=server,
            export=Path("/proc/fs/nfsd").is_dir(),
            ganesha_pidfile=env.get("KUMO_NFS_GANESHA_PIDFILE", "/run/ganesha/ganesha.pid"),
        )
    raise StorageError(f"this host serves no share tier {tier!r} (KUMO_SHARES)")


def share_error_for_tenants(tier: str) -> str:
    """What a project is told when its share could not be applied: no host path, no setting
    name (those go to the operators' log)."""
    return f"the {tier} storage could not prepare this share yet; the operators have been told"


def apply_share(message: protocol.ShareApply, drivers=share_driver) -> dict:
    """Converge one share and return the report: generation applied, usage or error."""
    report = {"share_id": message.share_id, "generation": message.generation, "ok": True}
    if message.generation < _share_generations.get(message.share_id, 0):
        log.info("share %s generation %d is stale", message.share_id, message.generation)
        return {**report, "generation": _share_generations[message.share_id], "stale": True}
    spec = ShareSpec(
        name=message.name,
        project_number=message.project_number,
        quota_gib=message.quota_gib,
        clients=tuple(message.clients),
    )
    try:
        driver = drivers(message.tier)
        if message.present:
            usage = driver.ensure_share(spec)
            report.update(used_bytes=usage.used_bytes, limit_bytes=usage.limit_bytes)
        else:
            driver.ensure_share_absent(spec)
            report.update(absent=True)
    except StorageError as e:
        log.warning("share %s generation %d failed: %s", message.share_id, message.generation, e)
        # ``error`` is shown to the project; ``detail`` (host paths, the operator's
        # configuration) only to operators, in the controller's log.
        return {
            **report,
            "ok": False,
            "error": share_error_for_tenants(message.tier),
            "detail": str(e)[:500],
        }
    _share_generations[message.share_id] = message.generation
    return report


@shared_task(name=protocol.SHARE_APPLY_TASK, acks_late=True, time_limit=600, ignore_result=True)
def share_apply(**wire) -> None:
    """Converge one share (``storage.protocol.ShareApply``), then report it."""
    message = protocol.ShareApply(**wire)
    with _lock:
        report = apply_share(message)
    reports.send(runtime.config().host, protocol.SHARE_APPLIED_REPORT, report)
