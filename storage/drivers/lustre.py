"""``ShareDriver`` on a Lustre file system with project quotas (mdx's /fast and /large).

A share is the directory ``<root>/<name>`` tagged with Lustre project id
``project_number`` and the inherit flag (``lfs project -p ID -s -r DIR``), so everything
made below it counts against that project; its hard block limit is set with
``lfs setquota -p ID -B <n>k ROOT`` and its usage read with ``lfs quota -p ID ROOT``.

Each share also has a Lustre nodemap, ``kumo-<project_number>``, whose NID ranges are
exactly the share's clients (``<address>@<lnet>``, one range per address) and whose
fileset is the share's directory: a client in it sees only that directory (mounted as the
file system's root), with root squashed (``admin=0``) and its user ids trusted
(``trusted=1``). Ranges are read back (``lctl get_param -n nodemap.<name>.ranges``) and
only the difference is added or deleted, so a repeat changes nothing. The commands run
where ``lctl`` reaches the MGS (``lctl`` may be e.g. a wrapper that runs it there); the
operator keeps the ``default`` nodemap closed to unknown clients (docs/operator/shares.md).

Every ``lfs`` and ``lctl`` call goes through ``run`` (argv in, stdout out; a non-zero exit raises
``StorageError``), so the commands and the parsing of their output are tested against
recorded ``lfs`` output; this driver has not run against a real Lustre file system.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from storage.drivers.base import GIB, ShareDriver, ShareSpec, ShareUsage, StorageError

Runner = Callable[[Sequence[str]], str]
_NUMBER = re.compile(r"^(\d+)\*?$")


def run_command(argv: Sequence[str]) -> str:
    """Run ``argv`` and return its stdout; StorageError with its stderr when it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise StorageError(f"{argv[0]}: {e}") from e
    if done.returncode != 0:
        raise StorageError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def parse_quota(output: str, root: str) -> tuple[int, int]:
    """(used KiB, hard block limit KiB) from ``lfs quota -p ID ROOT`` without ``-h``.

    The row of ``root`` has kbytes, quota, limit, grace, files, …; a long file system
    name puts the numbers on the next line; a ``*`` after a number marks it over a limit.
    """
    lines = output.splitlines()
    for index, line in enumerate(lines):
        fields = line.split()
        if not fields or fields[0] != root:
            continue
        numbers = fields[1:] or (lines[index + 1].split() if index + 1 < len(lines) else [])
        if len(numbers) < 3:
            break
        used, limit = _NUMBER.match(numbers[0]), _NUMBER.match(numbers[2])
        if used is None or limit is None:
            break
        return int(used[1]), int(limit[1])
    raise StorageError(f"lfs quota printed no usage row for {root}: {output[:200]!r}")


_RANGE = re.compile(r"start_nid:\s*([^,\s]+),\s*end_nid:\s*([^,\s}]+)")


def parse_ranges(output: str) -> set[str]:
    """The single-NID ranges of ``lctl get_param -n nodemap.<name>.ranges`` output."""
    return {start for start, end in _RANGE.findall(output) if start == end}


class LustreShareDriver(ShareDriver):
    """Shares under ``root``, a Lustre client mount on the agent's host (the file system's
    root as ``fileset_prefix`` names it from the MGS's side: "" when ``root`` is the
    mount of the file system's root)."""

    def __init__(
        self,
        root: str,
        *,
        run: Runner = run_command,
        lfs: str = "lfs",
        lctl: str = "lctl",
        lnet: str = "tcp",
        fileset_prefix: str = "",
        nodemaps: bool = True,
    ) -> None:
        self.root = root.rstrip("/") or "/"
        self.run = run
        self.lfs = lfs
        self.lctl = lctl
        self.lnet = lnet
        self.fileset_prefix = fileset_prefix.rstrip("/")
        self.nodemaps = nodemaps

    @staticmethod
    def nodemap(spec: ShareSpec) -> str:
        return f"kumo-{spec.project_number}"

    def ensure_nodemap(self, spec: ShareSpec) -> None:
        """The share's nodemap holds exactly its clients' NIDs, and its fileset is the
        share's directory."""
        name = self.nodemap(spec)
        try:
            current = parse_ranges(
                self.run([self.lctl, "get_param", "-n", f"nodemap.{name}.ranges"])
            )
        except StorageError:  # no such nodemap yet
            self.run([self.lctl, "nodemap_add", name])
            current = set()
        for prop, value in (("admin", "0"), ("trusted", "1")):
            self.run([self.lctl, "nodemap_modify", "--name", name, "--property", prop,
                      "--value", value])  # fmt: skip
        fileset = f"{self.fileset_prefix}/{spec.name}"
        self.run([self.lctl, "nodemap_set_fileset", "--name", name, "--fileset", fileset])
        wanted = {f"{address}@{self.lnet}" for address in spec.clients}
        for nid in sorted(current - wanted):
            self.run([self.lctl, "nodemap_del_range", "--name", name, "--range", nid])
        for nid in sorted(wanted - current):
            self.run([self.lctl, "nodemap_add_range", "--name", name, "--range", nid])

    def ensure_nodemap_absent(self, spec: ShareSpec) -> None:
        name = self.nodemap(spec)
        try:
            self.run([self.lctl, "get_param", "-n", f"nodemap.{name}.ranges"])
        except StorageError:
            return  # already gone
        self.run([self.lctl, "nodemap_del", name])

    def _dir(self, spec: ShareSpec) -> Path:
        return Path(self.root) / spec.name

    def ensure_share(self, spec: ShareSpec) -> ShareUsage:
        path = self._dir(spec)
        try:
            path.mkdir(mode=0o770, exist_ok=True)
        except OSError as e:
            raise StorageError(f"mkdir {path}: {e}") from e
        pid = str(spec.project_number)
        self.run([self.lfs, "project", "-p", pid, "-s", "-r", str(path)])
        limit_kib = spec.quota_gib * GIB // 1024
        self.run([self.lfs, "setquota", "-p", pid, "-b", "0", "-B", f"{limit_kib}k", self.root])
        if self.nodemaps:
            self.ensure_nodemap(spec)
        return self.usage(spec)

    def ensure_share_absent(self, spec: ShareSpec) -> None:
        if self.nodemaps:
            self.ensure_nodemap_absent(spec)  # no client reaches it while it is removed
        path = self._dir(spec)
        if path.exists():
            try:
                shutil.rmtree(path)
            except OSError as e:
                raise StorageError(f"remove {path}: {e}") from e
        pid = str(spec.project_number)
        self.run([self.lfs, "setquota", "-p", pid, "-b", "0", "-B", "0", self.root])

    def usage(self, spec: ShareSpec) -> ShareUsage:
        if not self._dir(spec).is_dir():
            raise StorageError(f"share {spec.name} does not exist under {self.root}")
        output = self.run([self.lfs, "quota", "-p", str(spec.project_number), self.root])
        used_kib, limit_kib = parse_quota(output, self.root)
        return ShareUsage(spec.name, used_kib * 1024, limit_kib * 1024)
