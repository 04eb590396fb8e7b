"""``ShareDriver`` for sites without Lustre: each share is an ext4 file system in a sparse
image of exactly its quota, loop-mounted at ``<root>/exports/<name>`` and exported over
NFS. The size of the file system is the hard limit, so the quota holds whatever the
clients do; growing a share grows the image and ``resize2fs`` grows the mounted file
system (online where the kernel allows it, else unmounted for a moment).

The export is a line per share in ``exports_file`` (an ``/etc/exports.d`` file) followed
by ``exportfs -ra``; with ``export=False`` (a kernel without an NFS server, as on the
development machine) the line is written and ``exportfs`` is not run. Commands go
through ``run`` like the Lustre driver's.
"""

from __future__ import annotations

import os
from pathlib import Path

from storage.drivers.base import GIB, ShareDriver, ShareSpec, ShareUsage, StorageError
from storage.drivers.lustre import Runner, run_command

EXPORT_OPTIONS = "rw,sync,no_subtree_check,root_squash"


class NfsShareDriver(ShareDriver):
    def __init__(
        self,
        root: str,
        *,
        exports_file: str,
        clients: str = "*",
        export: bool = True,
        run: Runner = run_command,
    ) -> None:
        self.root = Path(root)
        self.exports_file = Path(exports_file)
        self.clients = clients
        self.export = export
        self.run = run

    def image(self, spec: ShareSpec) -> Path:
        return self.root / "images" / f"{spec.name}.img"

    def mountpoint(self, spec: ShareSpec) -> Path:
        return self.root / "exports" / spec.name

    def export_line(self, spec: ShareSpec) -> str:
        return (
            f"{self.mountpoint(spec)} {self.clients}({EXPORT_OPTIONS},fsid={spec.project_number})"
        )

    def _write_exports(self, add: str = "", remove: str = "") -> None:
        lines = self.exports_file.read_text().splitlines() if self.exports_file.exists() else []
        wanted = [line for line in lines if line and not line.startswith(remove or "\0")]
        if add and add not in wanted:
            wanted.append(add)
        if wanted == lines:
            return
        self.exports_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.exports_file.with_suffix(".partial")
        partial.write_text("".join(f"{line}\n" for line in sorted(wanted)))
        os.replace(partial, self.exports_file)
        if self.export:
            self.run(["exportfs", "-ra"])

    def ensure_share(self, spec: ShareSpec) -> ShareUsage:
        image, mountpoint = self.image(spec), self.mountpoint(spec)
        size = spec.quota_gib * GIB
        try:
            image.parent.mkdir(parents=True, exist_ok=True)
            mountpoint.mkdir(parents=True, exist_ok=True)
            if not image.exists():
                partial = image.with_suffix(".partial")
                with open(partial, "wb") as f:
                    f.truncate(size)
                self.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-L", spec.name[:16], str(partial)])
                os.replace(partial, image)
            grow = image.stat().st_size < size
            if grow:
                with open(image, "r+b") as f:
                    f.truncate(size)
        except OSError as e:
            raise StorageError(f"share image {image}: {e}") from e
        if grow and os.path.ismount(mountpoint):
            self._grow_mounted(image, mountpoint)
        elif grow:
            self._grow_offline(image)
        if not os.path.ismount(mountpoint):
            self.run(["mount", "-o", "loop", str(image), str(mountpoint)])
        self._write_exports(add=self.export_line(spec))
        return self.usage(spec)

    def _grow_mounted(self, image: Path, mountpoint: Path) -> None:
        """Grow the mounted file system online; where the kernel refuses that (a container
        without CAP_SYS_RESOURCE), unmount, grow it offline and mount it again (NFS clients
        retry through the gap)."""
        device = self._loop_device(image)
        self.run(["losetup", "-c", device])
        try:
            self.run(["resize2fs", device])
        except StorageError:
            self.run(["umount", str(mountpoint)])
            self._grow_offline(image)

    def _grow_offline(self, image: Path) -> None:
        self.run(["e2fsck", "-f", "-p", str(image)])
        self.run(["resize2fs", str(image)])

    def _loop_device(self, image: Path) -> str:
        out = self.run(["losetup", "-j", str(image)])
        device = out.split(":", 1)[0].strip()
        if not device:
            raise StorageError(f"no loop device holds {image}")
        return device

    def ensure_share_absent(self, spec: ShareSpec) -> None:
        mountpoint = self.mountpoint(spec)
        self._write_exports(remove=f"{mountpoint} ")
        if os.path.ismount(mountpoint):
            self.run(["umount", str(mountpoint)])
        try:
            self.image(spec).unlink(missing_ok=True)
            if mountpoint.exists():
                mountpoint.rmdir()
        except OSError as e:
            raise StorageError(f"remove share {spec.name}: {e}") from e

    def usage(self, spec: ShareSpec) -> ShareUsage:
        mountpoint = self.mountpoint(spec)
        if not os.path.ismount(mountpoint):
            raise StorageError(f"share {spec.name} is not mounted at {mountpoint}")
        st = os.statvfs(mountpoint)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        return ShareUsage(spec.name, used, self.image(spec).stat().st_size)
