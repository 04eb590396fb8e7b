"""Users, projects, members, quotas, SSH keys and API tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from kumo_sdk.types.access import Identity


@dataclass(frozen=True)
class User:
    id: int
    username: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    display_name: str = ""
    organisation: str = ""
    affiliation: str = ""
    is_staff: bool = False
    date_joined: datetime | None = None
    identities: list[Identity] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class UserBrief:
    """A member as a project shows them."""

    username: str = ""
    email: str = ""
    first_name: str = ""
    last_name: str = ""


@dataclass(frozen=True)
class Project:
    slug: str
    name: str
    description: str = ""
    owner: str = ""
    status: str = ""
    valid_from: date | None = None
    valid_until: date | None = None
    my_role: str | None = None
    url: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class OperatorProject:
    """A project as operators see and make it."""

    url: str = ""
    slug: str = ""
    name: str = ""
    description: str = ""
    owner: str = ""
    status: str = ""
    valid_from: date | None = None
    valid_until: date | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ApiToken:
    """An API token. ``token``, the secret, is set only in the answer that created it."""

    id: int
    name: str
    prefix: str
    project: str | None = None
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None
    created_at: datetime | None = None
    token: str | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Member:
    """A member of the project and their role (reader < member < admin < owner)."""

    id: int = 0
    user: UserBrief | None = None
    role: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class SSHKey:
    """One of your SSH public keys; VMs install keys named in ``ssh_keys`` at creation."""

    id: int = 0
    name: str = ""
    public_key: str = ""
    key_type: str = ""
    bits: int = 0
    fingerprint: str = ""
    comment: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class QuotaLine:
    """One quota: its limit, what is in use (counted from what exists) and what is left."""

    limit: int = 0
    used: int = 0
    available: int = 0


@dataclass(frozen=True)
class Quota:
    """The project's quotas, one line per resource."""

    vcpus: QuotaLine | None = None
    memory_gib: QuotaLine | None = None
    gpus: QuotaLine | None = None
    vms: QuotaLine | None = None
    networks: QuotaLine | None = None
    global_ips: QuotaLine | None = None
    storage_gib: QuotaLine | None = None
    buckets: QuotaLine | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
