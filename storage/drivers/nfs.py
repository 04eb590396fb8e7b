"""``ShareDriver`` for sites without Lustre: each share is an ext4 file system in a sparse
image of exactly its quota, loop-mounted at ``<root>/exports/<name>`` and exported over
NFS. The size of the file system is the hard limit, so the quota holds whatever the
clients do; growing a share grows the image and ``resize2fs`` grows the mounted file
system (online where the kernel allows it, else unmounted for a moment).

Each share has its own export, to exactly ``ShareSpec.clients`` (its project's VMs on the
storage path); a share with no clients is not exported at all, so no other project's VM,
and no address that is not a VM of the project, can mount it. ``exports_file`` holds one
entry per share, headed ``# kumo:<name>``; it is rewritten whole (atomically) when an entry
changes, and the server told to read it again:

* ``server="kernel"``: the file is an ``/etc/exports.d`` file, one line per share
  (``<dir> <addr>(opts) <addr>(opts)``), then ``exportfs -ra``; with ``export=False`` (a
  kernel without an NFS server, as on the development machine) ``exportfs`` is not run.
* ``server="ganesha"``: the file holds one ganesha ``EXPORT`` block per share (included from
  ganesha's configuration), whose ``CLIENT`` block lists the addresses (everyone else:
  ``Access_Type = None``), then ``SIGHUP`` to the ganesha named by ``ganesha_pidfile``,
  which makes it read its exports again (adds, changes and removes; no DBus needed).

Commands go through ``run`` like the Lustre driver's.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from storage.drivers.base import GIB, ShareDriver, ShareSpec, ShareUsage, StorageError
from storage.drivers.lustre import Runner, run_command

EXPORT_OPTIONS = "rw,sync,no_subtree_check,root_squash"
_HEAD = "# kumo:"


def ganesha_export_id(spec: ShareSpec) -> int:
    """Ganesha's export ids are 16 bits (0 is its pseudo root): the share's project
    number folded into 2..65535, stable for the share's life."""
    return spec.project_number % 65534 + 2


class NfsShareDriver(ShareDriver):
    def __init__(
        self,
        root: str,
        *,
        exports_file: str,
        server: str = "kernel",
        export: bool = True,
        ganesha_pidfile: str = "",
        run: Runner = run_command,
    ) -> None:
        if server not in ("kernel", "ganesha"):
            raise ValueError(f"NFS server {server!r}: want kernel or ganesha")
        self.root = Path(root)
        self.exports_file = Path(exports_file)
        self.server = server
        self.export = export
        self.ganesha_pidfile = Path(ganesha_pidfile) if ganesha_pidfile else None
        self.run = run

    def image(self, spec: ShareSpec) -> Path:
        return self.root / "images" / f"{spec.name}.img"

    def mountpoint(self, spec: ShareSpec) -> Path:
        return self.root / "exports" / spec.name

    def export_entry(self, spec: ShareSpec) -> str:
        """The share's entry in ``exports_file`` ("" when it has no clients: no export)."""
        clients = sorted(set(spec.clients))
        if not clients:
            return ""
        mountpoint = self.mountpoint(spec)
        if self.server == "kernel":
            options = f"({EXPORT_OPTIONS},fsid={spec.project_number})"
            return f"{mountpoint} " + " ".join(f"{c}{options}" for c in clients)
        return "\n".join(
            [
                "EXPORT {",
                f"    Export_Id = {ganesha_export_id(spec)};",
                f'    Path = "{mountpoint}";',
                f'    Pseudo = "/kumo/{spec.name}";',
                "    Protocols = 3, 4;",
                "    Transports = TCP;",
                "    SecType = sys;",
                "    Squash = Root_Squash;",
                "    Access_Type = None;",
                "    FSAL { Name = VFS; }",
                f"    CLIENT {{ Clients = {', '.join(clients)}; Access_Type = RW; }}",
                "}",
            ]
        )

    def _entries(self) -> dict[str, str]:
        if not self.exports_file.exists():
            return {}
        entries: dict[str, list[str]] = {}
        name = None
        for line in self.exports_file.read_text().splitlines():
            if line.startswith(_HEAD):
                name = line[len(_HEAD) :].strip()
                entries[name] = []
            elif name is not None:
                entries[name].append(line)
        return {n: "\n".join(lines).strip() for n, lines in entries.items()}

    def _write_exports(self, name: str, entry: str) -> None:
        """Make ``name``'s entry ``entry`` (none when empty); rewrite the file and have the
        server read it again only when something changed."""
        entries = self._entries()
        wanted = (
            {**entries, name: entry} if entry else {n: e for n, e in entries.items() if n != name}
        )
        if wanted == entries and self.exports_file.exists():
            return
        self.exports_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.exports_file.with_suffix(".partial")
        partial.write_text("".join(f"{_HEAD}{n}\n{wanted[n]}\n" for n in sorted(wanted)))
        os.replace(partial, self.exports_file)
        self.reload()

    def reload(self) -> None:
        """Have the NFS server read ``exports_file`` again."""
        if self.server == "kernel":
            if self.export:
                self.run(["exportfs", "-ra"])
            return
        if self.ganesha_pidfile is None:
            return
        try:
            pid = int(self.ganesha_pidfile.read_text().strip())
            os.kill(pid, signal.SIGHUP)
        except (OSError, ValueError) as e:
            raise StorageError(f"ganesha ({self.ganesha_pidfile}) not reloaded: {e}") from e

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
        self._write_exports(spec.name, self.export_entry(spec))
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
        self._write_exports(spec.name, "")
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
