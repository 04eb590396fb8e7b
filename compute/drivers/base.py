"""The hypervisor driver contract.

A driver makes one host's hypervisor match what the control plane asked for. Every operation
is an idempotent ``ensure_*``: calling it again after success, or after a crash half-way, is
safe and converges on the same result. Work is keyed on ``(vm_id, generation)``: the driver
records the generation it applied inside the guest's definition, so after any error or
restart the agent can resync from ``list_guests()`` instead of trusting its own memory.

Only frozen dataclasses cross this boundary, never Django models: the host agent runs this
code without Django.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import ipaddress
import re
from dataclasses import dataclass

_VM_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<slot>[0-9a-fA-F]{2})\.(?P<function>[0-7])$"
)
_MAC_RE = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2}){5}$")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # the kernel's IFNAMSIZ, less the NUL


class DriverError(Exception):
    """The hypervisor refused or failed an operation. ``code`` is the backend's own error
    code when it has one (libvirt's ``VIR_ERR_*``), for logs; callers branch on the type."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class GuestNotFound(DriverError):
    """The operation needs a defined guest and there is none with this vm_id."""


class PowerState(enum.Enum):
    """Observed power state, as the hypervisor reports it (not the control plane's vm state
    or task state, which are separate fields)."""

    RUNNING = "running"
    SHUTOFF = "shutoff"
    PAUSED = "paused"
    CRASHED = "crashed"
    UNKNOWN = "unknown"


def validate_vm_id(vm_id: str) -> str:
    """Return ``vm_id`` if it is safe inside a domain name, else raise ``ValueError``."""
    if not _VM_ID_RE.match(vm_id):
        raise ValueError(f"invalid vm_id {vm_id!r}: want 1-63 of [A-Za-z0-9_.-]")
    return vm_id


@dataclass(frozen=True, order=True)
class PciAddress:
    """A PCI function on the host, e.g. ``0000:3b:00.0``."""

    domain: int
    bus: int
    slot: int
    function: int

    def __post_init__(self) -> None:
        limits = {"domain": 0xFFFF, "bus": 0xFF, "slot": 0x1F, "function": 0x7}
        for field, limit in limits.items():
            value = getattr(self, field)
            if not 0 <= value <= limit:
                raise ValueError(f"PCI {field} {value:#x} out of range 0..{limit:#x}")

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        """Parse ``DDDD:BB:SS.F`` (the domain may be left out and then is 0)."""
        match = _PCI_RE.match(text.strip())
        if match is None:
            raise ValueError(f"not a PCI address: {text!r}")
        return cls(
            domain=int(match["domain"] or "0", 16),
            bus=int(match["bus"], 16),
            slot=int(match["slot"], 16),
            function=int(match["function"], 16),
        )

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"


@dataclass(frozen=True)
class DiskSpec:
    """A block device backed by a file already present on the host or, with ``pool`` set,
    by volume ``source`` of that libvirt storage pool (``<disk type='volume'>``). ``serial``
    names the disk to the guest (``/dev/disk/by-id/virtio-<serial>``)."""

    source: str
    target_dev: str = "vda"
    format: str = "qcow2"
    read_only: bool = False
    pool: str = ""
    serial: str = ""
    size_bytes: int = 0  # a volume's size (what a live guest is grown to); 0: not known


class DeviceKind(enum.StrEnum):
    """What a host PCI function is to Kumo."""

    GPU = "gpu"  # a whole GPU, passed through with VFIO
    RDMA_VF = "rdma_vf"  # a virtual function of an RDMA NIC (RoCE), passed through
    RDMA_PF = "rdma_pf"  # the physical function of an RDMA NIC: the host keeps it
    OTHER = "other"


@dataclass(frozen=True)
class NumaCell:
    """One host NUMA cell: its id, its host CPU ids and its memory."""

    id: int
    cpus: tuple[int, ...]
    memory_mib: int


@dataclass(frozen=True)
class PciDevice:
    """A host PCI function as the node-device API reports it."""

    name: str  # libvirt's node-device name, e.g. pci_0000_07_00_0
    address: PciAddress
    kind: DeviceKind
    class_code: int  # e.g. 0x030200 for a 3D controller
    vendor_id: int
    product_id: int
    vendor_name: str = ""
    product_name: str = ""
    numa_node: int | None = None
    iommu_group: int | None = None
    physical_function: PciAddress | None = None  # for a VF: its PF


@dataclass(frozen=True)
class HostInventory:
    """What a host offers: CPUs, memory, NUMA cells and PCI devices Kumo cares about."""

    cpus: int
    memory_mib: int
    cells: tuple[NumaCell, ...]
    devices: tuple[PciDevice, ...]
    hypervisor: str = ""  # libvirt's driver type, e.g. QEMU or TEST
    accel: str = ""  # how real guests run: "kvm" or "tcg" (empty on a simulated host)


@dataclass(frozen=True)
class PassthroughDevice:
    """A host PCI function given whole to one guest (``<hostdev managed='yes'>``).

    ``numa_node`` is the host cell it hangs off; the guest sees it on the guest NUMA cell
    that mirrors that host cell, so NCCL and the driver see the real locality.
    """

    address: PciAddress
    kind: DeviceKind
    numa_node: int | None = None
    class_code: int = 0
    vendor_id: int = 0
    product_id: int = 0


class NicKind(enum.StrEnum):
    """How a guest NIC reaches its network."""

    TAP = "tap"  # a virtio NIC on a host tap device, which the network agent bridges
    VF = "vf"  # an RDMA NIC's virtual function, passed through as one of the spec's devices


@dataclass(frozen=True)
class GuestNic:
    """One network interface of a guest.

    A ``TAP`` NIC is a virtio NIC on the host tap device ``device``, which the hypervisor
    opens and never makes (the agent makes it before the guest starts; the network agent
    puts it on its network's bridge). A ``VF`` NIC is the virtual function at
    ``pci_address``, which must also be one of the spec's ``devices``: it adds no device of
    its own. Inside the guest the NIC is found by ``mac`` (lower case, as libvirt writes it)
    and configured by cloud-init with ``addresses`` (``192.168.10.11/24``), a default route
    via ``gateway`` (empty: none), ``dns`` servers, ``search`` domains and ``mtu``.
    """

    mac: str
    mtu: int
    kind: NicKind = NicKind.TAP
    device: str = ""
    pci_address: PciAddress | None = None
    addresses: tuple[str, ...] = ()
    gateway: str = ""
    dns: tuple[str, ...] = ()
    search: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _MAC_RE.match(self.mac):
            raise ValueError(f"invalid MAC {self.mac!r}: want lower-case aa:bb:cc:dd:ee:ff")
        if not 68 <= self.mtu <= 65535:
            raise ValueError(f"MTU {self.mtu} out of range 68..65535")
        if self.kind is NicKind.TAP and not _IFNAME_RE.match(self.device):
            raise ValueError(f"invalid tap device {self.device!r}: want 1-15 of [A-Za-z0-9_.-]")
        if self.kind is NicKind.VF and self.pci_address is None:
            raise ValueError("a VF NIC needs its pci_address")
        for address in self.addresses:
            ipaddress.ip_interface(address)  # ValueError when malformed
        if self.gateway:
            ipaddress.ip_address(self.gateway)
        for server in self.dns:
            ipaddress.ip_address(server)


@dataclass(frozen=True)
class GuestSpec:
    """What one guest should look like at one generation.

    ``numa_cell``, when set, confines vCPUs and memory to that host NUMA cell (the cell the
    GPUs hang off); ``devices`` (GPUs, RDMA VFs) are passed through whole with VFIO.
    ``seed_iso`` is a cloud-init NoCloud seed attached read-only as a CD-ROM. ``kernel`` (with
    ``initrd`` and ``cmdline``) boots the guest directly from host files instead of a disk.
    ``nics`` are the guest's network interfaces in the order it sees them: MACs and tap
    devices are unique, and each VF NIC names one of ``devices`` that is an RDMA VF.
    """

    vm_id: str
    generation: int
    name: str
    vcpus: int
    memory_mib: int
    numa_cell: int | None = None
    devices: tuple[PassthroughDevice, ...] = ()
    disks: tuple[DiskSpec, ...] = ()
    seed_iso: str | None = None
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str = ""
    nics: tuple[GuestNic, ...] = ()
    #: the host file the serial console is logged to (appended across boots; "" for none)
    console_log: str = ""

    def __post_init__(self) -> None:
        validate_vm_id(self.vm_id)
        if self.generation < 1:
            raise ValueError("generation starts at 1")
        if self.vcpus < 1 or self.memory_mib < 1:
            raise ValueError("vcpus and memory_mib must be positive")
        addresses = [device.address for device in self.devices]
        if len(set(addresses)) != len(addresses):
            raise ValueError("a device is listed twice")
        if self.initrd and not self.kernel:
            raise ValueError("an initrd needs a kernel")
        self._check_nics()

    def _check_nics(self) -> None:
        macs = [nic.mac for nic in self.nics]
        taps = [nic.device for nic in self.nics if nic.kind is NicKind.TAP]
        if len(set(macs)) != len(macs) or len(set(taps)) != len(taps):
            raise ValueError("a NIC's MAC or tap device is listed twice")
        vfs = {d.address for d in self.devices if d.kind is DeviceKind.RDMA_VF}
        for nic in self.nics:
            if nic.kind is NicKind.VF and nic.pci_address not in vfs:
                raise ValueError(f"VF NIC {nic.mac}: {nic.pci_address} is not a passed-through VF")

    @property
    def gpus(self) -> tuple[PciAddress, ...]:
        return tuple(d.address for d in self.devices if d.kind is DeviceKind.GPU)


@dataclass(frozen=True)
class GuestState:
    """One Kumo guest as observed on the host. ``generation`` is the generation of the
    persistent definition (what the guest boots with next)."""

    vm_id: str
    generation: int
    power: PowerState
    # CPU time the guest has used since it started, in ns (``list_guests`` reads it where
    # the hypervisor tells; None elsewhere). Reclamation's idleness is its growth. An
    # observation, not identity: left out of comparisons.
    cpu_time_ns: int | None = dataclasses.field(default=None, compare=False)


class HypervisorDriver(abc.ABC):
    """One host's hypervisor, seen through idempotent operations.

    ``simulated`` is true where guests never really run and disks are never read (the fake,
    libvirt's test driver): the agent then prepares no disk files.

    Guarantees shared by every implementation (checked by
    ``tests/compute/test_driver_contract.py``):

    * Every ``ensure_*`` may be repeated; a repeat after success changes nothing.
    * "Already running", "not running" and "not found" are success wherever the operation's
      goal is already met; they never surface as errors.
    * Failures raise ``DriverError`` (``GuestNotFound`` when a guest is required and missing);
      backend exceptions never leak.
    * Guests without Kumo metadata are invisible and untouched.
    """

    simulated: bool = False

    @abc.abstractmethod
    def ensure_defined(self, spec: GuestSpec) -> GuestState:
        """Make the persistent definition of ``spec.vm_id`` match ``spec``; return the guest.

        Defining the generation already recorded changes nothing (even if ``spec`` differs:
        a generation is immutable). A newer generation replaces the definition; a running
        guest keeps running and boots with the new definition at its next start. An older
        generation than the recorded one is stale and changes nothing; the returned state
        shows the generation actually in place. A same-named guest without Kumo metadata is
        never overwritten (``DriverError``). A ``numa_cell`` the host lacks is a
        ``DriverError``.
        """

    @abc.abstractmethod
    def ensure_running(self, vm_id: str) -> GuestState:
        """Start (or resume) the guest; a running guest is left alone.

        Raises ``GuestNotFound`` if it is not defined, ``DriverError`` if it cannot start.
        """

    @abc.abstractmethod
    def ensure_stopped(self, vm_id: str, *, graceful_timeout_s: float) -> GuestState:
        """Power the guest off: ask the guest OS to shut down, wait up to
        ``graceful_timeout_s``, then force it off. A guest already off is left alone; a
        paused or crashed guest is forced off at once. The definition stays.

        Raises ``GuestNotFound`` if it is not defined.
        """

    def power_off(self, vm_id: str) -> GuestState:
        """Force the guest off at once, without asking its OS (libvirt ``destroy``); a guest
        already off is left alone; the definition stays. ``GuestNotFound`` if undefined."""
        return self.ensure_stopped(vm_id, graceful_timeout_s=0)

    @abc.abstractmethod
    def reset(self, vm_id: str) -> GuestState:
        """Hard-reset a running guest, as the reset button does (``virDomainReset``): it
        reboots at once, its OS not asked, its definition and devices unchanged. A guest
        that is not running is left alone (its state returned). ``GuestNotFound`` if
        undefined."""

    @abc.abstractmethod
    def console_log(self, vm_id: str, max_bytes: int = 65536) -> bytes:
        """The last ``max_bytes`` of what the guest wrote to its serial console, across its
        boots (empty when it wrote nothing or logs nowhere). ``GuestNotFound`` if
        undefined."""

    @abc.abstractmethod
    def ensure_absent(self, vm_id: str) -> None:
        """Force the guest off and remove its definition. A guest that does not exist is
        success. Disks' backing files are not touched (storage owns them)."""

    @abc.abstractmethod
    def get_guest(self, vm_id: str) -> GuestState:
        """The observed state of one guest; ``GuestNotFound`` if it is not defined."""

    @abc.abstractmethod
    def list_guests(self) -> list[GuestState]:
        """Every Kumo guest on this host (those carrying Kumo metadata), sorted by vm_id.
        Other domains on the host are left out."""

    @abc.abstractmethod
    def host_inventory(self) -> HostInventory:
        """The host's CPUs, memory, NUMA cells (each with its CPU ids) and the PCI devices
        Kumo schedules (GPUs, RDMA NIC functions), read from the hypervisor each call."""

    @abc.abstractmethod
    def host_cells(self) -> tuple[NumaCell, ...]:
        """The host's NUMA cells with their CPU ids (fixed while the host runs: drivers may
        cache it)."""

    # -- volumes, live ---------------------------------------------------------------------

    @abc.abstractmethod
    def volume_disks(self, vm_id: str) -> dict[str, tuple[str, str, str]]:
        """The pool-backed disks (volumes) the guest has now: target dev -> (pool, volume,
        serial); those of the running guest when it runs, else of its definition.
        ``GuestNotFound`` if it is not defined."""

    @abc.abstractmethod
    def ensure_disk_attached(self, vm_id: str, disk: DiskSpec) -> None:
        """Give the guest ``disk`` at once: a running guest gets it live and in its
        definition (the guest sees ``/dev/disk/by-id/virtio-<serial>`` appear), a guest
        that is off in its definition only. A disk already there (live, defined, or both)
        is left as it is: a repeat is success. A simulated host changes the definition
        only (it runs no guest to hot-plug into)."""

    @abc.abstractmethod
    def ensure_disk_detached(self, vm_id: str, target_dev: str) -> None:
        """Take disk ``target_dev`` from the guest, live and from its definition; a disk it
        does not have is success. Waits for the running guest to release it (a hot-unplug
        needs the guest's consent); ``DriverError`` if it has not within the driver's
        timeout (a later repeat finishes the job)."""

    @abc.abstractmethod
    def ensure_disk_size(self, vm_id: str, target_dev: str, size_bytes: int) -> int:
        """Make the running guest see disk ``target_dev`` at least ``size_bytes`` large
        (a live block resize; never shrinks) and return the size it sees; a guest that is
        off sees the volume's size at its next start (returns 0: nothing to see)."""

    @abc.abstractmethod
    def domain_xml(self, vm_id: str) -> str:
        """The persistent definition as the hypervisor holds it (libvirt domain XML), for
        diagnostics and resync; ``GuestNotFound`` if it is not defined."""
