"""A host's cache of images, keyed by checksum. No Django here.

A guest's root disk is a qcow2 overlay on its image's cached copy. ``ImageCache.ensure``
gives the path of a verified copy:

- the copy is ``<root>/<sha256 hex>``; it is fetched (the URL the controller put in the
  guest's ``VmApply``: ``http(s)://`` or ``file://``) into ``<root>/.partial/<hex>.<pid>.<n>``,
  verified (size and SHA-256), then renamed into place: a failed or corrupt fetch leaves
  nothing under the final name, and nothing in ``.partial`` either;
- one fetch per checksum at a time, across threads and processes (an exclusive ``flock`` on
  ``<root>/.locks/<hex>``): a second guest needing the same image waits and then finds it;
- every ``ensure`` re-hashes the cached copy before answering, so a copy corrupted on disk
  is caught: it is discarded and fetched once more; a fetch that again does not match
  raises ``ImageChecksumMismatch`` (the agent reports it as the VM's error).

Each answer of ``ensure`` marks its copy used (its modification time). ``prune`` removes
the copies that no disk on the host is based on and that nobody asked for within a minimum
age (a day by default, as Nova's image cache manager keeps an unused base image): the
agent runs it every hour (``compute.host_tasks.image_cache_prune``). With a cap on the
cache's size, it then removes more of those copies, least recently used first, until the
rest fit under it. A copy removed is fetched again by the next guest that needs it.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import logging
import os
import re
import struct
import time
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK = 1 << 20
_HEX = re.compile(r"^sha256:([0-9a-f]{64})$")
_COPY = re.compile(r"^[0-9a-f]{64}$")  # a cached copy's file name
# Over its cap, the cache still keeps a copy ``ensure`` answered this recently: the overlay
# of the guest that asked is made from it right after.
CAP_MIN_AGE_S = 600.0
_seq = itertools.count()


class ImageCacheError(Exception):
    """The image could not be made available on this host."""


class ImageChecksumMismatch(ImageCacheError):
    pass


def _hex(checksum: str) -> str:
    match = _HEX.match(checksum)
    if match is None:
        raise ImageCacheError(f"unusable image checksum {checksum!r} (want sha256:<64 hex>)")
    return match.group(1)


def file_sha256(path: Path) -> tuple[str, int]:
    """``(sha256:<hex>, size)`` of the file at ``path``, read in chunks."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return "sha256:" + sha.hexdigest(), size


_QCOW2_MAGIC = b"QFI\xfb"
_QCOW2_BACKING = struct.Struct(">QI")  # the header's backing_file_offset and _size, at byte 8


def backing_file(disk: Path) -> Path | None:
    """The resolved path of the file the qcow2 disk ``disk`` is based on, read from its
    header (a name relative to the disk is relative to its folder); None for a disk that
    stands alone, for a file that is not qcow2, and for one that cannot be read."""
    try:
        with open(disk, "rb") as f:
            header = f.read(8 + _QCOW2_BACKING.size)
            if len(header) < 8 + _QCOW2_BACKING.size or header[:4] != _QCOW2_MAGIC:
                return None
            offset, size = _QCOW2_BACKING.unpack_from(header, 8)
            if not offset or not 0 < size < 4096:
                return None
            f.seek(offset)
            name = os.fsdecode(f.read(size))
    except OSError:
        return None
    return (disk.parent / name).resolve()


def urlopen(url: str, timeout: float):
    """Open ``url`` for reading (``http(s)://``, ``file://``); the default fetcher."""
    if not url.startswith(("http://", "https://", "file://")):
        raise ImageCacheError(f"cannot fetch an image from {url!r}")
    return urllib.request.urlopen(url, timeout=timeout)


class ImageCache:
    def __init__(
        self,
        root: Path | str,
        *,
        opener: Callable[[str, float], object] = urlopen,
        timeout_s: float = 60.0,
    ):
        self.root = Path(root)
        self.opener = opener
        self.timeout_s = timeout_s

    def path(self, checksum: str) -> Path:
        return self.root / _hex(checksum)

    @contextmanager
    def _lock(self, hex_: str, *, wait: bool = True):
        """The checksum's exclusive lock; ``wait=False``: BlockingIOError when it is held."""
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / hex_, "a+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def ensure(self, *, checksum: str, size: int, url: str) -> Path:
        """The path of this host's verified copy of the image ``checksum`` (``size`` bytes,
        fetched from ``url`` if the cache lacks it or holds it corrupted)."""
        hex_ = _hex(checksum)
        final = self.root / hex_
        with self._lock(hex_):
            if final.exists():
                actual, actual_size = file_sha256(final)
                if actual == checksum and actual_size == size:
                    os.utime(final)  # used now: ``prune`` leaves it for its minimum age
                    return final
                log.warning(
                    "image cache: %s is corrupt (%s, %d bytes); fetching it again",
                    final,
                    actual,
                    actual_size,
                )
                final.unlink()
            self._fetch(url, final, checksum=checksum, size=size)
            return final

    def prune(
        self,
        in_use: set[Path],
        *,
        min_age_s: float,
        max_bytes: int = 0,
        now: float | None = None,
    ) -> list[str]:
        """Remove the copies that no disk is based on (``in_use``: the resolved paths the
        host's disks name as their backing files) and that ``ensure`` has not answered for
        ``min_age_s``; returns their checksums. Then, when ``max_bytes`` is set and the
        copies left take more than that on disk, remove more of those no disk is based on,
        least recently used first, until the rest fit; a copy answered within
        ``CAP_MIN_AGE_S`` stays, and so do those disks are based on, even over the cap
        (guests run on them: a warning says so). Each is looked at again under its
        checksum's lock, taken without waiting: a copy being fetched or checked meanwhile is
        in use and stays, and one ``ensure`` answered a moment ago is too young to go, so the
        overlay made from it right after is safe."""
        if not self.root.is_dir():
            return []
        now = time.time() if now is None else now
        removed, unused, total = [], [], 0
        for path in sorted(self.root.iterdir()):
            if not _COPY.match(path.name):
                continue
            based_on = path.resolve() in in_use
            if not based_on and self._remove(path, min_age_s, now):
                removed.append(f"sha256:{path.name}")
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            size = stat.st_blocks * 512  # what it takes on disk (a copy may be sparse)
            total += size
            if not based_on:
                unused.append((stat.st_mtime, path, size))
        if max_bytes <= 0 or total <= max_bytes:  # no cap, or under it
            return removed
        for _used_at, path, size in sorted(unused):
            if total <= max_bytes:
                break
            if self._remove(path, CAP_MIN_AGE_S, now):
                removed.append(f"sha256:{path.name}")
                total -= size
        if total > max_bytes:
            log.warning(
                "image cache: %s holds %d bytes, over its cap of %d: the rest are disks' "
                "images or were used within %d s",
                self.root,
                total,
                max_bytes,
                CAP_MIN_AGE_S,
            )
        return removed

    def _remove(self, path: Path, min_age_s: float, now: float) -> bool:
        """Remove the copy at ``path`` if ``ensure`` has not answered it for ``min_age_s``
        and nobody holds its lock; whether it did."""
        try:
            with self._lock(path.name, wait=False):
                if now - path.stat().st_mtime < min_age_s:
                    return False
                path.unlink()
        except (BlockingIOError, FileNotFoundError):
            return False  # in use this moment, or gone already
        return True

    def _fetch(self, url: str, final: Path, *, checksum: str, size: int) -> None:
        partial_dir = self.root / ".partial"
        partial_dir.mkdir(parents=True, exist_ok=True)
        partial = partial_dir / f"{final.name}.{os.getpid()}.{next(_seq)}"
        sha = hashlib.sha256()
        received = 0
        try:
            try:
                source = self.opener(url, self.timeout_s)
            except OSError as e:
                raise ImageCacheError(f"fetching image {checksum}: {e}") from e
            with source, open(partial, "wb") as out:
                while chunk := source.read(CHUNK):
                    received += len(chunk)
                    if received > size:
                        raise ImageChecksumMismatch(
                            f"image {checksum}: more than the expected {size} bytes arrived"
                        )
                    sha.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            actual = "sha256:" + sha.hexdigest()
            if received != size or actual != checksum:
                raise ImageChecksumMismatch(
                    f"image checksum mismatch: expected {checksum} ({size} bytes), "
                    f"fetched {actual} ({received} bytes)"
                )
            os.replace(partial, final)
            log.info("image cache: fetched %s (%d bytes)", final, received)
        except OSError as e:
            raise ImageCacheError(f"fetching image {checksum}: {e}") from e
        finally:
            partial.unlink(missing_ok=True)
