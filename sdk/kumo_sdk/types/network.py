"""Networks, subnets, ports, security groups, global IPs, port forwards, external
connections; operators' pools and host agents."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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
class ExternalConnection:
    """An L2VPN, L3 route or site VPN; realized once an operator approves it."""

    id: int = 0
    project: str = ""
    name: str = ""
    kind: str = ""
    network: str | None = None
    vlan_id: int | None = None
    destination_cidr: str = ""
    next_hop: str | None = None
    remote: str = ""
    state: str = ""
    review_note: str = ""
    reviewed_at: datetime | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class GlobalIpPool:
    """A pool of global addresses projects allocate from (operators)."""

    id: int = 0
    name: str = ""
    cidr: str = ""
    gateway_ip: str = ""
    pool_start: str = ""
    pool_end: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class HostNetwork:
    """A host's network agent: its settings and how far it has converged (operators)."""

    host: str = ""
    vtep_address: str | None = None
    underlay_device: str = ""
    underlay_mtu: int = 0
    gateway: bool = False
    external_bridge: str = ""
    trunk_device: str = ""
    sriov_pfs: Any | None = None
    desired_generation: int = 0
    applied_generation: int = 0
    converged: bool = False
    applied_at: datetime | None = None
    last_error: str = ""
    reported_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
