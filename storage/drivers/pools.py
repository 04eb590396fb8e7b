"""``PoolDriver`` over a libvirt connection: ``dir`` and ``logical`` pools on real hosts,
the test driver's pools on simulated ones.

The connection is the hypervisor driver's own (``compute.drivers.libvirt.LibvirtDriver
.connection``): libvirt's test driver keeps pools per connection, so a second connection
would see other pools. libvirt 9's test driver has no ``virStorageVolResize``; a simulated
volume holds no data, so there growing a volume re-creates it at the new size. Everything
else is the same call on both.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import TypeVar

import libvirt

from storage.drivers.base import GIB, PoolDriver, PoolSpec, StorageError, VolumeInfo, VolumeSpec

T = TypeVar("T")
_MISSING = {libvirt.VIR_ERR_NO_STORAGE_POOL, libvirt.VIR_ERR_NO_STORAGE_VOL}


def _call(what: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except libvirt.libvirtError as exc:
        raise StorageError(f"{what}: {exc}") from exc


def pool_xml(pool: PoolSpec) -> str:
    root = ET.Element("pool", type=pool.kind)
    ET.SubElement(root, "name").text = pool.name
    if pool.kind == "logical":
        source = ET.SubElement(root, "source")
        ET.SubElement(source, "name").text = pool.source
        ET.SubElement(source, "format", type="lvm2")
    target = ET.SubElement(root, "target")
    ET.SubElement(target, "path").text = pool.target or (
        f"/dev/{pool.source}" if pool.kind == "logical" else f"/var/lib/kumo/pools/{pool.name}"
    )
    return ET.tostring(root, encoding="unicode")


def volume_xml(spec: VolumeSpec, *, kind: str) -> str:
    root = ET.Element("volume")
    ET.SubElement(root, "name").text = spec.name
    ET.SubElement(root, "capacity", unit="bytes").text = str(spec.capacity_gib * GIB)
    if kind == "dir":  # a logical volume is raw; a file is preallocated metadata-only qcow2
        ET.SubElement(root, "allocation", unit="bytes").text = "0"
        target = ET.SubElement(root, "target")
        ET.SubElement(target, "format", type="raw")
    return ET.tostring(root, encoding="unicode")


class LibvirtPoolDriver(PoolDriver):
    def __init__(self, conn: libvirt.virConnect, *, simulated: bool = False) -> None:
        self._conn = conn
        self.simulated = simulated

    def _pool(self, name: str) -> libvirt.virStoragePool | None:
        try:
            return self._conn.storagePoolLookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in _MISSING:
                return None
            raise StorageError(f"lookup pool {name}: {exc}") from exc

    def _active_pool(self, name: str) -> libvirt.virStoragePool:
        pool = self._pool(name)
        if pool is None:
            raise StorageError(f"storage pool {name} is not defined on this host")
        if not pool.isActive():
            _call(f"start pool {name}", lambda: pool.create(0))
        return pool

    def ensure_pool(self, pool: PoolSpec) -> None:
        found = self._pool(pool.name)
        if found is None:
            found = _call(
                f"define pool {pool.name}", lambda: self._conn.storagePoolDefineXML(pool_xml(pool))
            )
            if pool.kind == "dir" and not self.simulated:
                _call(f"build pool {pool.name}", lambda: found.build(0))
            _call(f"autostart pool {pool.name}", lambda: found.setAutostart(1))
        if not found.isActive():
            _call(f"start pool {pool.name}", lambda: found.create(0))

    @staticmethod
    def _info(pool_name: str, vol: libvirt.virStorageVol) -> VolumeInfo:
        _type, capacity, _allocation = _call(f"read volume {vol.name()}", vol.info)
        return VolumeInfo(pool=pool_name, name=vol.name(), capacity_bytes=capacity, path=vol.path())

    def _volume(self, pool: libvirt.virStoragePool, name: str):
        try:
            return pool.storageVolLookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() in _MISSING:
                return None
            raise StorageError(f"lookup volume {name}: {exc}") from exc

    def ensure_volume(self, spec: VolumeSpec) -> VolumeInfo:
        pool = self._active_pool(spec.pool)
        kind = ET.fromstring(_call("read pool", lambda: pool.XMLDesc(0))).get("type", "dir")
        vol = self._volume(pool, spec.name)
        wanted = spec.capacity_gib * GIB
        if vol is not None and self._info(spec.pool, vol).capacity_bytes < wanted:
            if self.simulated:
                _call(f"re-create volume {spec.name}", lambda: vol.delete(0))
                vol = None
            else:
                _call(f"resize volume {spec.name}", lambda: vol.resize(wanted, 0))
        if vol is None:
            vol = _call(
                f"create volume {spec.name}",
                lambda: pool.createXML(volume_xml(spec, kind=kind), 0),
            )
        return self._info(spec.pool, vol)

    def ensure_volume_absent(self, pool: str, name: str) -> None:
        found = self._pool(pool)
        if found is None:
            return
        if not found.isActive():
            _call(f"start pool {pool}", lambda: found.create(0))
        vol = self._volume(found, name)
        if vol is None:
            return
        try:
            vol.delete(0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in _MISSING:
                raise StorageError(f"delete volume {name}: {exc}") from exc

    def list_volumes(self, pool: str) -> list[VolumeInfo]:
        found = self._active_pool(pool)
        _call(f"refresh pool {pool}", lambda: found.refresh(0))
        volumes = _call(f"list volumes of {pool}", lambda: found.listAllVolumes(0))
        return sorted((self._info(pool, v) for v in volumes), key=lambda v: v.name)
