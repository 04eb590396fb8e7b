"""The NFS share driver, for real on this machine: a share is an ext4 image of its quota,
loop-mounted, so writing past the quota fails with ENOSPC; growing it grows the mounted
file system. Needs root and loop devices (skipped with the reason otherwise). The kernel
here has no NFS server (no /proc/fs/nfsd, no nfsd module), so the export is checked as
the exports line written, and ``exportfs`` is not run."""

import errno
import os
import shutil
from pathlib import Path

import pytest

from storage.drivers.base import GIB, ShareSpec, StorageError
from storage.drivers.lustre import run_command
from storage.drivers.nfs import NfsShareDriver


def _loop_mounts_work() -> str:
    if os.geteuid() != 0:
        return "needs root to loop-mount"
    if not Path("/dev/loop-control").exists() or not shutil.which("mkfs.ext4"):
        return "needs loop devices and mkfs.ext4"
    return ""


pytestmark = pytest.mark.skipif(bool(_loop_mounts_work()), reason=_loop_mounts_work() or "-")


@pytest.fixture
def driver(tmp_path):
    commands = []

    def run(argv):
        commands.append(list(argv))
        return run_command(argv)

    d = NfsShareDriver(
        str(tmp_path / "nfs"), exports_file=str(tmp_path / "kumo.exports"), export=False, run=run
    )
    d.commands = commands
    yield d
    for mount in sorted((tmp_path / "nfs" / "exports").glob("*")):
        if os.path.ismount(mount):
            run_command(["umount", str(mount)])


def _fill(path: Path, mib: int) -> None:
    with open(path, "wb") as f:
        chunk = b"\0" * 2**20
        for _ in range(mib):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def test_a_share_is_mounted_exported_and_holds_no_more_than_its_quota(driver, tmp_path):
    spec = ShareSpec(
        name="genome-1a2b", project_number=100001, quota_gib=1, clients=("10.0.0.6", "10.0.0.5")
    )
    usage = driver.ensure_share(spec)
    mount = driver.mountpoint(spec)
    assert os.path.ismount(mount)
    assert usage.limit_bytes == GIB and usage.used_bytes < 64 * 2**20
    exports = (tmp_path / "kumo.exports").read_text()
    options = "(rw,sync,no_subtree_check,root_squash,fsid=100001)"
    # exported to exactly the project's VMs, never to everyone
    assert exports == f"# kumo:genome-1a2b\n{mount} 10.0.0.5{options} 10.0.0.6{options}\n"
    with pytest.raises(OSError) as full:
        _fill(mount / "big", 1100)
    assert full.value.errno == errno.ENOSPC
    assert driver.usage(spec).used_bytes > 900 * 2**20


def test_growing_a_share_grows_the_mounted_file_system(driver):
    spec = ShareSpec(name="genome-1a2b", project_number=100001, quota_gib=1)
    driver.ensure_share(spec)
    _fill(driver.mountpoint(spec) / "kept", 10)
    before = os.statvfs(driver.mountpoint(spec))
    grown = driver.ensure_share(ShareSpec(name=spec.name, project_number=100001, quota_gib=2))
    after = os.statvfs(driver.mountpoint(spec))
    assert grown.limit_bytes == 2 * GIB
    assert after.f_blocks * after.f_frsize > 1.8 * before.f_blocks * before.f_frsize
    assert (driver.mountpoint(spec) / "kept").stat().st_size == 10 * 2**20
    assert any(c[0] == "resize2fs" for c in driver.commands)


def test_repeat_changes_nothing(driver):
    spec = ShareSpec(name="s1", project_number=5, quota_gib=1)
    driver.ensure_share(spec)
    driver.commands.clear()
    driver.ensure_share(spec)
    assert [c[0] for c in driver.commands] == []


def test_absent_unmounts_unexports_and_deletes(driver, tmp_path):
    keep = ShareSpec(name="other", project_number=6, quota_gib=1, clients=("10.0.0.7",))
    spec = ShareSpec(name="s1", project_number=5, quota_gib=1, clients=("10.0.0.5",))
    driver.ensure_share(keep)
    driver.ensure_share(spec)
    driver.ensure_share_absent(spec)
    driver.ensure_share_absent(spec)
    assert not driver.image(spec).exists() and not driver.mountpoint(spec).exists()
    assert (tmp_path / "kumo.exports").read_text() == f"# kumo:other\n{driver.export_entry(keep)}\n"
    with pytest.raises(StorageError, match="not mounted"):
        driver.usage(spec)
