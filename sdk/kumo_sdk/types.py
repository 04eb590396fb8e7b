"""Typed results: one frozen dataclass per API resource.

``decode(cls, body)`` builds one from a JSON body: timestamps become ``datetime``, dates
``date``, nested objects their dataclass. Fields the server adds later are ignored (an older
SDK keeps working) and are still in ``raw``, the body exactly as the server sent it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")


def decode(cls: type[T], body: dict[str, Any]) -> T:
    """``cls`` from a JSON object; ``raw`` keeps the object itself."""
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name == "raw":
            values["raw"] = body
        elif f.name in body:
            values[f.name] = _convert(hints[f.name], body[f.name])
    return cls(**values)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _convert(inner, value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if hint is datetime:
        return datetime.fromisoformat(value)
    if hint is date:
        return date.fromisoformat(value)
    if dataclasses.is_dataclass(hint):
        return decode(hint, value)
    return value


@dataclass(frozen=True)
class User:
    id: int
    username: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    is_staff: bool = False
    date_joined: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


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
class Template:
    name: str
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_model: str = ""
    disk_gib: int = 0
    spot_allowed: bool = False
    active: bool = True
    description: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Image:
    id: int
    name: str
    description: str = ""
    os_distro: str = ""
    os_version: str = ""
    format: str = ""
    location: str = ""
    checksum: str = ""
    size_bytes: int | None = None
    min_disk_gib: int = 0
    min_memory_gib: int = 0
    visibility: str = ""
    project: str | None = None
    active: bool = True
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Nic:
    """One NIC of a VM: its port, network, MAC and addresses."""

    port: str
    network: str
    mac: str = ""
    fixed_ips: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class VirtualMachine:
    """A VM. ``operation`` is the URL of the operation that creates it, in a create's
    answer only."""

    id: str
    name: str
    state: str
    url: str = ""
    template: str = ""
    image: int | None = None
    priority: str = "on_demand"
    placement_group: str | None = None
    vcpus: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_model: str = ""
    disk_gib: int = 0
    task_state: str = ""
    power_state: str = ""
    state_reason: str = ""
    generation: int = 0
    host: str | None = None
    numa_cell: int | None = None
    gpu_addresses: list[str] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    launched_at: datetime | None = None
    deleted_at: datetime | None = None
    operation: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Network:
    id: str
    name: str
    vni: int | None = None
    mtu: int | None = None
    kind: str = "overlay"
    description: str = ""
    external_access: bool = False
    rdma_dscp: int | None = None
    rdma_ecn: bool | None = None
    rdma_pfc_priority: int | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Subnet:
    id: int
    network: str
    cidr: str
    name: str = ""
    gateway_ip: str | None = None
    pool_start: str | None = None
    pool_end: str | None = None
    dns_servers: list[str] = field(default_factory=list)
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Port:
    id: str
    network: str
    mac: str = ""
    name: str = ""
    fixed_ips: list[str] = field(default_factory=list)
    vm: str | None = None
    device_index: int = 0
    host: str | None = None
    binding: str = ""
    port_security: bool = True
    security_groups: list[str] = field(default_factory=list)
    global_ip: str | None = None
    status: str = "down"
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class SecurityGroupRule:
    id: int
    group: str
    direction: str
    protocol: str = "any"
    port_min: int | None = None
    port_max: int | None = None
    remote_cidr: str = ""
    remote_group: str | None = None
    description: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class SecurityGroup:
    id: int
    name: str
    description: str = ""
    rules: list[SecurityGroupRule] = field(default_factory=list)
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class GlobalIp:
    """A global address of the project; ``port`` is set while it is 1:1 NATed to a port.
    ``router`` marks the project router's own address (not the project's to change)."""

    id: int
    address: str
    pool: str = ""
    port: str | None = None
    router: bool = False
    description: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class PortForward:
    id: int
    global_ip: str
    protocol: str
    external_port: int
    port: str
    internal_port: int
    description: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Operation:
    """Asynchronous work: ``state`` runs pending → running → succeeded or failed."""

    id: str
    state: str
    kind: str = ""
    url: str = ""
    target_type: str = ""
    target_id: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deadline_at: datetime | None = None
    finished_at: datetime | None = None
    result: dict[str, Any] = field(default_factory=dict)
    error_code: str = ""
    error_message: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")


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


@dataclass(frozen=True)
class UsageRecord:
    """One interval of use of a resource; ``ended_at`` is None while it is still in use.
    ``quantity`` is a decimal string, as the server sends it."""

    id: int
    resource: str
    started_at: datetime
    subject_type: str = ""
    subject_id: str = ""
    subject_name: str = ""
    model: str = ""
    priority: str = ""
    quantity: str = ""
    ended_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Invoice:
    """A month's invoice. Amounts are decimal strings, exactly as the server sends them."""

    id: int
    period_start: date
    period_end: date
    project: str = ""
    currency: str = ""
    total: str = ""
    points_applied: str = ""
    amount_due: str = ""
    content_hash: str = ""
    issued_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ForecastLine:
    resource: str
    model: str = ""
    priority: str = ""
    rate_card: int | None = None
    unit: str = ""
    quantity: str = ""
    unit_price: str = ""
    factor: str = ""
    amount: str = ""


@dataclass(frozen=True)
class ForecastBudget:
    name: str
    amount: str = ""
    spent_percent: str = ""
    projected_percent: str = ""


@dataclass(frozen=True)
class Forecast:
    """This month's spend so far and projected to the month's end (decimal strings), the
    points balance, each active budget's share and the projected invoice's lines."""

    period_start: date
    period_end: date
    at: datetime | None = None
    currency: str = ""
    so_far: str = ""
    projected: str = ""
    points_balance: str = ""
    budgets: list[ForecastBudget] = field(default_factory=list)
    lines: list[ForecastLine] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
