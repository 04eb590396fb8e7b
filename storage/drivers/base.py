"""The storage driver contracts: block volumes in a host's storage pools, shared file
systems with a quota per project, and the admin side of an S3-compatible object store.

Every operation is an idempotent ``ensure_*`` (repeating it after success, or after a
crash half-way, converges on the same result); "already exists" and "not found" are
success wherever the goal is met. Failures raise ``StorageError``; backend exceptions never
leak. Only frozen dataclasses cross these boundaries: the host agent runs this code
without Django. The contract suites are ``tests/storage/test_*_contract.py``.
"""

from __future__ import annotations

import abc
import ipaddress
import re
from dataclasses import dataclass

GIB = 2**30
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class StorageError(Exception):
    """The backend refused or failed an operation."""


def validate_name(name: str) -> str:
    """Return ``name`` if it is safe as a pool, volume or directory name, else ValueError."""
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid storage name {name!r}: want 1-63 of [A-Za-z0-9_.-]")
    return name


# --- block volumes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolSpec:
    """A libvirt storage pool. ``kind`` ``dir``: files under ``target`` (a directory);
    ``logical``: LVM logical volumes of volume group ``source`` (``target`` is /dev/<vg>)."""

    name: str
    kind: str = "dir"
    target: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        validate_name(self.name)
        if self.kind not in ("dir", "logical"):
            raise ValueError(f"pool kind {self.kind!r}: want dir or logical")
        if self.kind == "logical" and not self.source:
            raise ValueError("a logical pool needs its volume group as source")


@dataclass(frozen=True)
class VolumeSpec:
    """One volume of ``capacity_gib`` in pool ``pool``, named ``name`` (Kumo names it
    ``vol-<volume id>``, so the name is the idempotency key)."""

    pool: str
    name: str
    capacity_gib: int

    def __post_init__(self) -> None:
        validate_name(self.pool)
        validate_name(self.name)
        if self.capacity_gib < 1:
            raise ValueError("capacity_gib must be positive")


@dataclass(frozen=True)
class VolumeInfo:
    pool: str
    name: str
    capacity_bytes: int
    path: str


class PoolDriver(abc.ABC):
    """A host's storage pools and their volumes.

    * ``ensure_pool`` defines, builds and starts a pool; an active pool is left alone.
    * ``ensure_volume`` creates a missing volume at ``capacity_gib`` and grows a smaller one
      to it; it never shrinks a volume (a smaller request leaves it as it is) and never
      touches its data.
    * ``ensure_volume_absent`` deletes a volume; a missing volume or pool is success.
    * A volume or pool of another name is never touched.
    """

    @abc.abstractmethod
    def ensure_pool(self, pool: PoolSpec) -> None: ...

    @abc.abstractmethod
    def ensure_volume(self, spec: VolumeSpec) -> VolumeInfo: ...

    @abc.abstractmethod
    def ensure_volume_absent(self, pool: str, name: str) -> None: ...

    @abc.abstractmethod
    def list_volumes(self, pool: str) -> list[VolumeInfo]:
        """The pool's volumes sorted by name; StorageError when the pool is not defined."""


# --- shared file systems ---------------------------------------------------------------------


@dataclass(frozen=True)
class ShareSpec:
    """A project's directory on a shared file system with a hard limit of ``quota_gib``.

    ``project_number`` is the numeric id the file system accounts the share under (a Lustre
    project id); ``name`` the directory under the tier's root. ``clients``: the only
    addresses that may reach it (its project's VMs on the storage path); empty, none may."""

    name: str
    project_number: int
    quota_gib: int
    clients: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_name(self.name)
        for client in self.clients:
            ipaddress.ip_address(client)  # ValueError: only plain addresses reach a share
        if self.project_number < 1:
            raise ValueError("project_number must be positive")
        if self.quota_gib < 1:
            raise ValueError("quota_gib must be positive")


@dataclass(frozen=True)
class ShareUsage:
    name: str
    used_bytes: int
    limit_bytes: int


class ShareDriver(abc.ABC):
    """Shares on one file system tier.

    * ``ensure_share`` makes the share if missing and raises its limit to ``quota_gib``;
      it never lowers a limit (Kumo only ever extends a share) and keeps the data already
      there; it lets exactly ``clients`` reach the share (an NFS export per share, a Lustre
      nodemap per share), nobody when there are none. Returns its usage.
    * ``ensure_share_absent`` removes the share and its data; a missing share is success.
    * ``usage`` reads what the share holds now; StorageError when it does not exist.
    """

    @abc.abstractmethod
    def ensure_share(self, spec: ShareSpec) -> ShareUsage: ...

    @abc.abstractmethod
    def ensure_share_absent(self, spec: ShareSpec) -> None: ...

    @abc.abstractmethod
    def usage(self, spec: ShareSpec) -> ShareUsage: ...


# --- object storage --------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    """An S3 access key; the secret exists only in the answer to its creation."""

    access_key_id: str
    secret_access_key: str


class ObjectStoreAdmin(abc.ABC):
    """The admin side of an S3-compatible service: one user per project, its keys, and
    buckets that only their owner's keys may use.

    * ``ensure_user`` makes the user; an existing one is left alone.
    * ``create_key`` makes a new key of an existing user (StorageError if it is missing).
    * ``delete_key`` / ``delete_user``: missing is success; deleting a user deletes its keys.
    * ``ensure_bucket`` makes the bucket owned by ``owner`` and usable by the keys of
      ``owner`` alone; a bucket already owned by ``owner`` is success, one owned by anyone
      else is a StorageError.
    * ``delete_bucket`` deletes a bucket and every object in it; missing is success.
    * ``set_bucket_quota`` limits a bucket's bytes (``enforces_quota`` says whether the
      service refuses writes past it or only Kumo's accounting sees it).
    * ``bucket_usage`` is the bytes a bucket holds now.
    """

    enforces_quota: bool = False

    @abc.abstractmethod
    def ensure_user(self, user: str) -> None: ...

    @abc.abstractmethod
    def delete_user(self, user: str) -> None: ...

    @abc.abstractmethod
    def create_key(self, user: str) -> KeyPair: ...

    @abc.abstractmethod
    def delete_key(self, user: str, access_key_id: str) -> None: ...

    @abc.abstractmethod
    def ensure_bucket(self, bucket: str, owner: str) -> None: ...

    @abc.abstractmethod
    def delete_bucket(self, bucket: str, owner: str) -> None: ...

    @abc.abstractmethod
    def set_bucket_quota(self, bucket: str, owner: str, max_bytes: int) -> None: ...

    @abc.abstractmethod
    def bucket_usage(self, bucket: str) -> int: ...
