"""Templates, images, VMs, placement groups, reclamation; operators' hosts, devices and
guarantees."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from kumo_sdk.types.base import BEYOND_SCHEMA


@dataclass(frozen=True)
class Template:
    name: str
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_model: str = ""
    disk_gib: int = 0
    spot_allowed: bool = False
    eviction_notice_s: int = 30
    evict_action: str = "stop"
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
    login_user: str = ""
    location: str = ""
    checksum: str = ""
    size_bytes: int | None = None
    min_disk_gib: int = 0
    min_memory_gib: int = 0
    visibility: str = ""
    project: str | None = None
    state: str = ""
    state_reason: str = ""
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
    """A VM. A spot VM being evicted has ``eviction_notice_at`` and ``eviction_deadline``
    (``evicted_at`` once done); a VM reclamation has scheduled shows ``reclaim_action``,
    ``reclaim_reason`` and ``reclaim_at``. ``running_since`` (its last start) and
    ``checkpointed_at`` (its guest's last reported checkpoint) say since when an eviction
    would lose its work; ``checkpoint_interval_s`` (the interval before that checkpoint)
    is when Kumo expects the next. ``operation`` is the URL of the operation that
    creates it, in a create's answer only."""

    id: str
    name: str
    state: str
    url: str = ""
    template: str = ""
    image: int | None = None
    priority: str = "on_demand"
    placement_group: str | None = None
    lease: str | None = None
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
    running_since: datetime | None = None
    checkpointed_at: datetime | None = None
    checkpoint_interval_s: float | None = None
    deleted_at: datetime | None = None
    eviction_notice_at: datetime | None = None
    eviction_deadline: datetime | None = None
    eviction_acknowledged_at: datetime | None = None
    evicted_at: datetime | None = None
    active_at: datetime | None = None
    reclaim_action: str = ""
    reclaim_reason: str = ""
    reclaim_at: datetime | None = None
    # In a create's answer only (the schema's VirtualMachineAccepted), not in the other
    # answers that carry a VM (the operators' list): beyond those answers' schemas.
    operation: str | None = field(default=None, metadata=BEYOND_SCHEMA)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class PlacementGroup:
    """A placement group: affinity, anti-affinity or compact (one rack)."""

    id: int = 0
    name: str = ""
    policy: str = ""
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Lease:
    """A reservation of ``gpus`` GPUs of ``gpu_model`` over ``[starts_at, ends_at)``, or of
    ``hosts`` whole hosts (every GPU of each; None for a lease of GPUs): scheduled,
    preparing (its GPUs held, spot VMs on them noticed), active, ended or cancelled. VMs
    created in it (``vms.create(..., lease=name)``) run on its GPUs. ``lend_idle``: while
    active, spot VMs may run on the GPUs its VMs leave idle (a VM of the lease then waits
    for their eviction notice)."""

    id: int = 0
    project: str = ""
    name: str = ""
    gpu_model: str = ""
    gpus: int = 0
    hosts: int | None = None
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    lend_idle: bool = True
    state: str = ""
    state_reason: str = ""
    created_by: str | None = None
    created_at: datetime | None = None
    ended_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ReclamationThresholds:
    """The reclamation settings in force."""

    idle_after_s: int = 0
    idle_cpu_percent: float = 0.0
    idle_warning_s: int = 0
    expired_stop_notice_s: int = 0
    expired_delete_grace_s: int = 0
    spot_stop_grace_s: float = 0.0
    spot_eviction_cost_s: float = 0.0
    spot_notice_stretch_s: float = 0.0


@dataclass(frozen=True)
class ReclamationStep:
    """A reclamation step scheduled for a VM of the project."""

    vm: str = ""
    name: str = ""
    action: str = ""
    reason: str = ""
    at: datetime | None = None


@dataclass(frozen=True)
class ConsoleTicket:
    """A VM's interactive serial console: open ``url`` (a websocket; the token is in its
    query) before ``expires_at``. The token connects once, to that VM, for its user."""

    url: str
    token: str
    expires_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Reclamation:
    """The project's reclamation: its status, guaranteed minimum, thresholds and steps scheduled."""

    project_status: str = ""
    valid_until: date | None = None
    min_gpus: int = 0
    thresholds: ReclamationThresholds | None = None
    scheduled: list[ReclamationStep] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Host:
    """A host of the fleet, its state, inventory and use (operators)."""

    name: str = ""
    state: str = ""
    state_reason: str = ""
    libvirt_uri: str = ""
    hypervisor: str = ""
    guest_accel: str = ""  # how real guests run there: kvm or tcg (empty: simulated)
    agent_version: str = ""
    agent_started_at: datetime | None = None
    capabilities: Any | None = None
    last_heartbeat_at: datetime | None = None
    rack: str = ""
    zone: str = ""
    vcpus: int = 0
    memory_mib: int = 0
    numa_cells: Any | None = None
    cpu_allocation_ratio: float = 0.0
    ram_allocation_ratio: float = 0.0
    vcpus_used: int = 0
    memory_mib_used: int = 0
    gpus: int = 0
    gpus_free: int = 0
    inventory_reported_at: datetime | None = None
    guests_reported_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Device:
    """A PCI device of a host (GPU or RDMA function) and the VM holding it (operators)."""

    id: int = 0
    host: str = ""
    pci_address: str = ""
    kind: str = ""
    model: str = ""
    numa_node: int | None = None
    iommu_group: int | None = None
    physical_function: str = ""
    present: bool = False
    vm: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class CapacityGuarantee:
    """A project's guaranteed minimum of GPUs of one model and of vCPUs: other projects'
    on-demand VMs never take it, and its spot VMs within it are never evicted."""

    project: str = ""
    min_gpus: int = 0
    gpu_model: str = ""
    min_vcpus: int = 0
    updated_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
