"""An in-memory ``HypervisorDriver`` that keeps real state, for tests and local development.

It accounts what a host would: defined guests with their definitions and generations, power
state, and which GPUs running guests hold (a GPU can be attached to one running guest only,
as VFIO enforces). It reports a fixed ``HostInventory`` (``default_inventory()`` unless one is
given). ``fail_next`` injects failures on chosen calls, so callers' error paths can be tested
without a broken host.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from compute.drivers import domain_xml
from compute.drivers.base import (
    DeviceKind,
    DiskSpec,
    DriverError,
    GuestNotFound,
    GuestSpec,
    GuestState,
    HostInventory,
    HypervisorDriver,
    NumaCell,
    PciAddress,
    PciDevice,
    PowerState,
    validate_vm_id,
)

# Mirrors libvirt's test:///default host: two NUMA cells of eight CPUs.
DEFAULT_CELLS: Mapping[int, tuple[int, ...]] = {0: tuple(range(8)), 1: tuple(range(8, 16))}
DEFAULT_CELL_MEMORY_MIB = 4096
# default_inventory(): one A100 on each of the first two cells, and one ConnectX-6 with two
# SR-IOV VFs on the first cell.
_DEFAULT_GPU_ADDRESSES = ("0000:3b:00.0", "0000:af:00.0")
_DEFAULT_NIC_ADDRESS = "0000:5e:00.0"
_DEFAULT_VF_ADDRESSES = ("0000:5e:00.1", "0000:5e:00.2")


def _device(address: str, kind: DeviceKind, numa_node: int, group: int, **fields) -> PciDevice:
    pci = PciAddress.parse(address)
    name = "pci_" + str(pci).replace(":", "_").replace(".", "_")
    return PciDevice(name, pci, kind, numa_node=numa_node, iommu_group=group, **fields)


def default_inventory(cells: Mapping[int, Iterable[int]] = DEFAULT_CELLS) -> HostInventory:
    """A small host: ``cells`` (cell id -> host CPU ids) with ``DEFAULT_CELL_MEMORY_MIB``
    each, an A100 on each of the first two cells (by id) and a ConnectX-6 PF with two VFs on
    the first cell. Device fields are what ``LibvirtDriver`` reports for the same hardware."""
    numa_cells = tuple(
        NumaCell(cell, tuple(cpus), DEFAULT_CELL_MEMORY_MIB) for cell, cpus in sorted(cells.items())
    )
    ids = [cell.id for cell in numa_cells]
    gpu = {
        "class_code": 0x030200,
        "vendor_id": 0x10DE,
        "product_id": 0x20B0,
        "vendor_name": "NVIDIA Corporation",
        "product_name": "GA100 [A100 SXM4 40GB]",
    }
    nic = {
        "class_code": 0x020700,
        "vendor_id": 0x15B3,
        "vendor_name": "Mellanox Technologies",
    }
    devices = [
        _device(address, DeviceKind.GPU, cell, group, **gpu)
        for group, (address, cell) in enumerate(zip(_DEFAULT_GPU_ADDRESSES, ids, strict=False))
    ]
    if ids:
        group = len(devices)
        devices.append(
            _device(
                _DEFAULT_NIC_ADDRESS,
                DeviceKind.RDMA_PF,
                ids[0],
                group,
                product_id=0x101B,
                product_name="MT28908 Family [ConnectX-6]",
                **nic,
            )
        )
        for offset, address in enumerate(_DEFAULT_VF_ADDRESSES, start=1):
            devices.append(
                _device(
                    address,
                    DeviceKind.RDMA_VF,
                    ids[0],
                    group + offset,
                    product_id=0x101C,
                    product_name="MT28908 Family [ConnectX-6 Virtual Function]",
                    physical_function=PciAddress.parse(_DEFAULT_NIC_ADDRESS),
                    **nic,
                )
            )
    return HostInventory(
        cpus=sum(len(cell.cpus) for cell in numa_cells),
        memory_mib=DEFAULT_CELL_MEMORY_MIB * len(numa_cells),
        cells=numa_cells,
        devices=tuple(sorted(devices, key=lambda device: device.address)),
        hypervisor="FAKE",
    )


@dataclass
class _Guest:
    spec: GuestSpec
    power: PowerState = PowerState.SHUTOFF
    live_disks: dict = field(default_factory=dict)  # target -> DiskSpec, while running
    live_sizes: dict = field(default_factory=dict)  # target -> bytes the guest sees
    console: bytes = b""
    resets: int = 0


class FakeDriver(HypervisorDriver):
    """Thread-safe in-memory host that reports ``inventory``; its cells are the ones NUMA
    pinning accepts. Without an inventory it is ``default_inventory(cells)`` (``cells`` maps
    NUMA cell ids to host CPU ids, ``DEFAULT_CELLS`` by default); give one or the other."""

    def __init__(
        self,
        *,
        cells: Mapping[int, Iterable[int]] | None = None,
        inventory: HostInventory | None = None,
    ) -> None:
        if cells is not None and inventory is not None:
            raise ValueError("give cells or inventory, not both")
        if inventory is None:
            inventory = default_inventory(DEFAULT_CELLS if cells is None else cells)
        self._inventory = inventory
        self.cells = {cell.id: cell.cpus for cell in inventory.cells}
        self._guests: dict[str, _Guest] = {}
        self._foreign: set[str] = set()  # domain names that exist but are not Kumo's
        self._failures: dict[str, deque[BaseException]] = defaultdict(deque)
        self._lock = threading.RLock()
        self.calls: list[tuple[str, str]] = []  # (method, vm_id), for assertions

    simulated = True  # runs no guest, reads no disk

    # -- failure injection ------------------------------------------------------------------

    def fail_next(self, method: str, exc: BaseException | None = None) -> None:
        """Make the next call to ``method`` raise ``exc`` (a ``DriverError`` by default)
        before it changes anything. Queued failures fire in order, one per call."""
        if not callable(getattr(HypervisorDriver, method, None)):
            raise ValueError(f"{method!r} is not a driver method")
        self._failures[method].append(exc or DriverError(f"injected failure in {method}"))

    def _enter(self, method: str, vm_id: str) -> None:
        self.calls.append((method, vm_id))
        queued = self._failures.get(method)
        if queued:
            raise queued.popleft()

    # -- helpers ----------------------------------------------------------------------------

    def _get(self, vm_id: str) -> _Guest:
        guest = self._guests.get(validate_vm_id(vm_id))
        if guest is None:
            raise GuestNotFound(f"no guest {domain_xml.domain_name(vm_id)}")
        return guest

    @staticmethod
    def _state(guest: _Guest) -> GuestState:
        return GuestState(guest.spec.vm_id, guest.spec.generation, guest.power)

    def _gpus_held_by_others(self, vm_id: str) -> set[PciAddress]:
        held: set[PciAddress] = set()
        for other_id, other in self._guests.items():
            if other_id != vm_id and other.power in (PowerState.RUNNING, PowerState.PAUSED):
                held.update(other.spec.gpus)
        return held

    # -- contract ---------------------------------------------------------------------------

    def ensure_defined(self, spec: GuestSpec) -> GuestState:
        with self._lock:
            self._enter("ensure_defined", spec.vm_id)
            if spec.numa_cell is not None and spec.numa_cell not in self.cells:
                raise DriverError(f"host has no NUMA cell {spec.numa_cell}")
            if domain_xml.domain_name(spec.vm_id) in self._foreign:
                raise DriverError(f"domain kumo-{spec.vm_id} exists but carries no Kumo metadata")
            guest = self._guests.get(spec.vm_id)
            if guest is None:
                guest = self._guests[spec.vm_id] = _Guest(spec)
            elif spec.generation > guest.spec.generation:
                guest.spec = spec
            return self._state(guest)

    def ensure_running(self, vm_id: str) -> GuestState:
        with self._lock:
            self._enter("ensure_running", vm_id)
            guest = self._get(vm_id)
            if guest.power is not PowerState.RUNNING:
                busy = self._gpus_held_by_others(vm_id) & set(guest.spec.gpus)
                if busy:
                    names = ", ".join(sorted(str(gpu) for gpu in busy))
                    raise DriverError(f"vm {vm_id}: GPU {names} in use by another guest")
                guest.power = PowerState.RUNNING
                guest.live_disks = {d.target_dev: d for d in guest.spec.disks if d.pool}
                guest.live_sizes = {t: d.size_bytes for t, d in guest.live_disks.items()}
            return self._state(guest)

    def ensure_stopped(self, vm_id: str, *, graceful_timeout_s: float) -> GuestState:
        with self._lock:
            self._enter("ensure_stopped", vm_id)
            guest = self._get(vm_id)
            guest.power = PowerState.SHUTOFF
            guest.live_disks, guest.live_sizes = {}, {}
            return self._state(guest)

    def reset(self, vm_id: str) -> GuestState:
        with self._lock:
            self._enter("reset", vm_id)
            guest = self._get(vm_id)
            if guest.power is PowerState.RUNNING:
                guest.resets += 1
            return self._state(guest)

    def console_log(self, vm_id: str, max_bytes: int = 65536) -> bytes:
        with self._lock:
            self._enter("console_log", vm_id)
            return self._get(vm_id).console[-max_bytes:] if max_bytes > 0 else b""

    def ensure_absent(self, vm_id: str) -> None:
        with self._lock:
            self._enter("ensure_absent", vm_id)
            if domain_xml.domain_name(vm_id) in self._foreign:
                raise DriverError(f"domain kumo-{vm_id} carries no Kumo metadata; not removing")
            self._guests.pop(validate_vm_id(vm_id), None)

    def get_guest(self, vm_id: str) -> GuestState:
        with self._lock:
            self._enter("get_guest", vm_id)
            return self._state(self._get(vm_id))

    def list_guests(self) -> list[GuestState]:
        with self._lock:
            self._enter("list_guests", "")
            return [self._state(self._guests[vm_id]) for vm_id in sorted(self._guests)]

    def volume_disks(self, vm_id: str) -> dict[str, tuple[str, str, str]]:
        with self._lock:
            self._enter("volume_disks", vm_id)
            guest = self._get(vm_id)
            disks = (
                guest.live_disks.values()
                if guest.power is PowerState.RUNNING
                else [d for d in guest.spec.disks if d.pool]
            )
            return {d.target_dev: (d.pool, d.source, d.serial) for d in disks}

    def ensure_disk_attached(self, vm_id: str, disk: DiskSpec) -> None:
        with self._lock:
            self._enter("ensure_disk_attached", vm_id)
            guest = self._get(vm_id)
            if guest.power is PowerState.RUNNING and disk.target_dev not in guest.live_disks:
                guest.live_disks[disk.target_dev] = disk
                guest.live_sizes[disk.target_dev] = disk.size_bytes
            if all(d.target_dev != disk.target_dev for d in guest.spec.disks):
                guest.spec = replace(guest.spec, disks=(*guest.spec.disks, disk))

    def ensure_disk_detached(self, vm_id: str, target_dev: str) -> None:
        with self._lock:
            self._enter("ensure_disk_detached", vm_id)
            guest = self._get(vm_id)
            guest.live_disks.pop(target_dev, None)
            guest.live_sizes.pop(target_dev, None)
            kept = tuple(d for d in guest.spec.disks if d.target_dev != target_dev)
            guest.spec = replace(guest.spec, disks=kept)

    def ensure_disk_size(self, vm_id: str, target_dev: str, size_bytes: int) -> int:
        with self._lock:
            self._enter("ensure_disk_size", vm_id)
            guest = self._get(vm_id)
            if guest.power is not PowerState.RUNNING:
                return 0
            if target_dev not in guest.live_disks:
                raise DriverError(f"vm {vm_id} has no disk {target_dev}")
            guest.live_sizes[target_dev] = max(guest.live_sizes[target_dev], size_bytes)
            return guest.live_sizes[target_dev]

    def domain_xml(self, vm_id: str) -> str:
        with self._lock:
            self._enter("domain_xml", vm_id)
            spec = self._get(vm_id).spec
            return domain_xml.build_domain_xml(spec, cells=self.host_cells())

    def host_inventory(self) -> HostInventory:
        with self._lock:
            self._enter("host_inventory", "")
            return self._inventory

    # -- host topology ----------------------------------------------------------------------

    def host_cells(self) -> tuple[NumaCell, ...]:
        """The inventory's NUMA cells (as ``LibvirtDriver.host_cells``)."""
        return self._inventory.cells

    # -- fake-only controls -----------------------------------------------------------------

    def add_foreign_domain(self, name: str) -> None:
        """Simulate a domain someone else defined on the host (no Kumo metadata)."""
        with self._lock:
            self._foreign.add(name)

    def write_console(self, vm_id: str, data: bytes) -> None:
        """Simulate the guest printing ``data`` on its serial console."""
        with self._lock:
            self._get(vm_id).console += data

    def resets_of(self, vm_id: str) -> int:
        """How many hard resets the guest has had."""
        with self._lock:
            return self._get(vm_id).resets

    def set_power(self, vm_id: str, power: PowerState) -> None:
        """Simulate what happens behind the agent's back (a guest crash, a pause)."""
        with self._lock:
            self._get(vm_id).power = power
