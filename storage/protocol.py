"""The wire between the controller and the storage side of host agents. Django-free.

Volumes travel inside a VM's ``vm_apply`` (``compute.protocol.VolumeWire``); a volume no
VM holds is deleted with ``VOLUME_DELETE_TASK`` on the host whose pool holds it. A share
is sent whole, with its generation, to the host serving its tier (``SHARE_APPLY_TASK``);
the agent answers every one with ``SHARE_APPLIED_REPORT`` carrying the share's usage, so
the periodic re-send (``KUMO_SHARE_SYNC_S``) both repairs drift and refreshes usage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Commands, on the host's own queue.
VOLUME_DELETE_TASK = "kumo.host.storage.volume_delete"
SHARE_APPLY_TASK = "kumo.host.storage.share_apply"

# Reports, to the controller's queue.
SHARE_APPLIED_REPORT = "storage.share_applied"

# The libvirt storage pool of each volume tier (each agent maps them to its own pools).
POOLS = {"local": "kumo-local", "shared": "kumo-shared"}


@dataclass(frozen=True)
class ShareApply:
    """Share ``share_id`` at ``generation``: present with ``quota_gib`` on tier ``tier``
    as directory ``name`` (accounted as ``project_number``), reachable from exactly the
    addresses ``clients`` (its project's VMs), or absent."""

    share_id: str
    generation: int
    tier: str
    name: str
    project_number: int
    quota_gib: int
    present: bool = True
    clients: tuple[str, ...] = ()

    def to_wire(self) -> dict:
        return asdict(self)
