"""Volumes on a live guest, on a real QEMU domain under libvirtd (``qemu:///system``):
``LibvirtDriver`` attaches a volume to the running guest (live and in its definition, with
its serial), grows it live, and detaches it, and ``host_tasks.converge_volumes`` does the
same from a guest spec. libvirt's test driver has no device hot-plug, so only a real
hypervisor can show this.

The guest is diskless: Debian's kernel with the busybox initramfs of
``test_kvm_boot.py``, under QEMU's TCG (``<domain type='qemu'>``: nested KVM hangs on
these machines), 256 MiB and one vCPU. The kernel's PCIe hot-plug driver (built into
Debian's kernel) takes the disk in and lets it go, which is all the live domain XML needs;
the guest's own view (``/dev/disk/by-id/virtio-<serial>``) is checked by the real-guest
end-to-end test. Skips with the reason where libvirtd, a kernel or busybox is missing
(``make kvm-host`` prepares them).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from compute import host_tasks
from compute.drivers import domain_xml
from compute.drivers.base import DiskSpec, GuestSpec, PowerState
from tests.compute.test_kvm_boot import BUSYBOX, _cpio_newc, _is_static_elf, _kernel

URI = "qemu:///system"
MIB = 1 << 20


INIT = """#!/bin/sh
/bin/busybox mount -t proc proc /proc
echo KUMO-LIVE-VOLUMES-UP
/bin/busybox sleep 600
/bin/busybox poweroff -f
"""


def build_initramfs(path: Path) -> None:
    """busybox and an ``/init`` that idles for ten minutes (then powers the guest off)."""
    path.write_bytes(
        _cpio_newc(
            [
                ("bin", 0o040755, b"", (0, 0)),
                ("dev", 0o040755, b"", (0, 0)),
                ("proc", 0o040755, b"", (0, 0)),
                ("bin/busybox", 0o100755, BUSYBOX.read_bytes(), (0, 0)),
                ("bin/sh", 0o120777, b"busybox", (0, 0)),
                ("dev/console", 0o020600, b"", (5, 1)),
                ("init", 0o100755, INIT.encode(), (0, 0)),
            ]
        )
    )


def _skip_reason() -> str | None:
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (`make kvm-host`)"
    kernel = _kernel()
    if kernel is None or not kernel.is_file():
        return "no kernel to boot: /boot/vmlinuz-* missing (`make kvm-host` installs one)"
    if not BUSYBOX.is_file() or not _is_static_elf(BUSYBOX):
        return f"{BUSYBOX} missing or not static (`make kvm-host` installs busybox-static)"
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        libvirt.open(URI).close()
    except libvirt.libvirtError as exc:
        return f"libvirt {URI} does not answer ({exc}); `make kvm-host` starts libvirtd"
    return None


@pytest.fixture
def live_guest():
    """A running diskless TCG guest, a dir storage pool with two volumes, and the driver;
    every name carries a random suffix and is removed afterwards."""
    if reason := _skip_reason():
        pytest.skip(reason)
    import libvirt

    from compute.drivers.libvirt import LibvirtDriver

    suffix = secrets.token_hex(4)
    folder = Path(tempfile.mkdtemp(prefix=f"kumo-livevol-{suffix}-"))
    folder.chmod(0o755)  # QEMU's user reads the kernel files and the volumes
    initrd = folder / "initramfs.cpio"
    build_initramfs(initrd)
    pool_dir = folder / "pool"
    pool_dir.mkdir()
    pool_dir.chmod(0o777)
    driver = LibvirtDriver(URI, cpu_mode="host-model", poll_interval_s=0.2, detach_timeout_s=240)
    driver._domain_type = "qemu"  # TCG: nested KVM hangs here (the agent's accel setting
    # is the `guest` work's; this test pins TCG itself)
    conn = driver.connection
    pool_name = f"kumo-test-{suffix}"
    pool = conn.storagePoolCreateXML(
        f"<pool type='dir'><name>{pool_name}</name><target><path>{pool_dir}</path></target></pool>",
        0,
    )
    for name in ("vol-a", "vol-b"):
        pool.createXML(
            f"<volume><name>{name}</name><capacity unit='bytes'>{8 * MIB}</capacity>"
            "<target><format type='raw'/></target></volume>",
            0,
        )
    vm_id = str(uuid.uuid4())
    spec = GuestSpec(
        vm_id=vm_id,
        generation=1,
        name="Kumo live volume test",
        vcpus=1,
        memory_mib=256,
        kernel=str(_kernel()),
        initrd=str(initrd),
        cmdline="console=ttyS0 pcie_ports=native",
    )
    try:
        driver.ensure_defined(spec)
        assert driver.ensure_running(vm_id).power is PowerState.RUNNING
        yield driver, spec, pool_name, pool_dir
    finally:
        driver.ensure_absent(vm_id)
        with contextlib.suppress(libvirt.libvirtError):
            pool.destroy()
        driver.close()
        shutil.rmtree(folder, ignore_errors=True)


def _live_disks(driver, vm_id) -> dict[str, ET.Element]:
    dom = driver.connection.lookupByName(domain_xml.domain_name(vm_id))
    root = ET.fromstring(dom.XMLDesc(0))
    return {d.find("target").get("dev"): d for d in root.iterfind("devices/disk")}


def test_volumes_attach_grow_and_detach_on_a_running_guest(live_guest):
    driver, spec, pool, pool_dir = live_guest
    vm_id = spec.vm_id
    disk = DiskSpec(
        source="vol-a",
        pool=pool,
        target_dev="vdb",
        format="raw",
        serial="kumovola" + secrets.token_hex(6),
        size_bytes=8 * MIB,
    )
    started = time.monotonic()
    driver.ensure_disk_attached(vm_id, disk)
    live = _live_disks(driver, vm_id)
    assert "vdb" in live, "the running guest did not get the disk"
    assert live["vdb"].findtext("serial") == disk.serial
    assert live["vdb"].find("source").get("volume") == "vol-a"
    assert "vdb" in domain_xml.volume_disks(driver.domain_xml(vm_id))  # and its definition
    assert driver.volume_disks(vm_id) == {"vdb": (pool, "vol-a", disk.serial)}
    driver.ensure_disk_attached(vm_id, disk)  # a repeat changes nothing
    assert list(_live_disks(driver, vm_id)) == ["vdb"]

    assert driver.ensure_disk_size(vm_id, "vdb", 24 * MIB) == 24 * MIB
    dom = driver.connection.lookupByName(domain_xml.domain_name(vm_id))
    assert dom.blockInfo("vdb")[0] == 24 * MIB  # what QEMU gives the guest
    assert (pool_dir / "vol-a").stat().st_size == 24 * MIB
    assert driver.ensure_disk_size(vm_id, "vdb", 8 * MIB) == 24 * MIB  # never shrinks

    # The agent's convergence from a spec: vol-b joins at vdc while vdb stays.
    b = DiskSpec(source="vol-b", pool=pool, target_dev="vdc", format="raw", serial="kumovolb")
    host_tasks.converge_volumes(replace(spec, disks=(disk, b)), driver)
    assert {"vdb", "vdc"} <= set(_live_disks(driver, vm_id))

    # Detaching waits for the guest to release the disk: under TCG its kernel needs a while
    # to bring up its PCIe hot-plug driver, so the first detach may wait for that.
    host_tasks.converge_volumes(replace(spec, disks=(b,)), driver)
    live = _live_disks(driver, vm_id)
    assert "vdb" not in live and "vdc" in live
    assert "vdb" not in domain_xml.volume_disks(driver.domain_xml(vm_id))
    assert driver.volume_disks(vm_id) == {"vdc": (pool, "vol-b", "kumovolb")}
    driver.ensure_disk_detached(vm_id, "vdb")  # a missing disk is success
    driver.ensure_disk_detached(vm_id, "vdc")
    assert driver.volume_disks(vm_id) == {}
    assert driver.get_guest(vm_id).power is PowerState.RUNNING
    print(f"live attach, grow and detach took {time.monotonic() - started:.1f} s")
