"""What a host agent last did to each guest: a small persistent store, one file per VM.

Django-free. libvirt's domain metadata records the generation a guest was defined with, but
a guest that was removed leaves nothing behind: without a record, a message older than the
removal (redelivered by the broker after its visibility timeout, or replayed) would define
and start the deleted guest again. So the agent keeps, per VM, the last generation it
applied and whether that was a removal (a tombstone), and refuses anything older
(``compute.host_tasks.apply``).

Each record is a JSON file written atomically (write, fsync, rename), so a crash leaves the
old record or the new one, never half of one. Records of removed guests are kept for
``KEEP_TOMBSTONES_S`` (longer than any broker redelivery), then dropped by ``prune``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

# A tombstone outlives any redelivery: Redis' visibility timeout is one hour.
KEEP_TOMBSTONES_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Applied:
    generation: int
    absent: bool
    at: float  # time.time() when recorded


class AppliedStore:
    """The last generation applied to each guest of this host, including its removal."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def _path(self, vm_id: str) -> Path:
        return self.directory / f"{uuid.UUID(vm_id)}.json"  # a VM id, nothing else

    def get(self, vm_id: str) -> Applied | None:
        try:
            data = json.loads(self._path(vm_id).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return Applied(int(data["generation"]), bool(data["absent"]), float(data["at"]))

    def record(self, vm_id: str, generation: int, *, absent: bool) -> None:
        """Remember that ``vm_id`` is at ``generation`` (removed, with ``absent``). A record
        never goes back: an older generation than the one held is ignored."""
        held = self.get(vm_id)
        if held is not None and held.generation > generation:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(vm_id)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with open(partial, "w") as f:
            json.dump({"generation": generation, "absent": absent, "at": time.time()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)

    def prune(self, *, now: float | None = None) -> int:
        """Drop tombstones older than ``KEEP_TOMBSTONES_S``; returns how many."""
        now = time.time() if now is None else now
        dropped = 0
        for path in self.directory.glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if data.get("absent") and now - float(data.get("at", now)) > KEEP_TOMBSTONES_S:
                path.unlink(missing_ok=True)
                dropped += 1
        return dropped
