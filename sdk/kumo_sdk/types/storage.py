"""Volumes, shares, buckets and access keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Volume:
    """A block volume. ``vm`` and ``device`` are set while it is attached (``in_use``);
    ``guest_path`` is where the guest finds the disk whatever its kernel names it."""

    id: str
    name: str
    size_gib: int
    state: str
    tier: str = ""
    project: str = ""
    description: str = ""
    vm: str | None = None
    device: str = ""
    guest_path: str = ""
    host: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Share:
    """A shared file system of the project; guests mount it with ``mount_command``."""

    id: str = ""
    project: str = ""
    name: str = ""
    tier: str = ""
    backend: str = ""
    quota_gib: int = 0
    used_bytes: int = 0
    usage_at: datetime | None = None
    mount_source: str = ""
    mount_point: str = ""
    fstype: str = ""
    mount_command: str = ""
    ready: bool = False
    last_error: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Bucket:
    """An S3 bucket of the project, reached at ``endpoint`` with its access keys."""

    name: str
    quota_gib: int
    project: str = ""
    used_bytes: int | None = None
    usage_at: datetime | None = None
    endpoint: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class AccessKey:
    """An S3 access key of the project. ``secret_access_key`` (and ``endpoint``) are set
    only in the answer that created it."""

    id: int
    access_key_id: str
    project: str = ""
    description: str = ""
    created_by: str | None = None
    created_at: datetime | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    endpoint: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
