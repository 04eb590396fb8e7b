"""``HypervisorDriver`` over a libvirt connection (``qemu:///system`` on hosts,
``test:///default`` in tests).

This is the only module that calls libvirt. Every libvirt error becomes a ``DriverError``
(``GuestNotFound`` for ``VIR_ERR_NO_DOMAIN``), and the outcomes the contract calls success
("already running", "not running", "no such domain" while removing) are decided by reading
the domain's state first and by tolerating those error codes when a race beats the read.
"""

from __future__ import annotations

import logging
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import TypeVar

import libvirt

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
    PciDevice,
    PowerState,
    validate_vm_id,
)
from compute.drivers.libvirt_inventory import (
    cells_from_node_info,
    classify_pci,
    parse_capability_cells,
    parse_pci_device,
)

# The host's parsing lives in ``libvirt_inventory``; its functions stay importable from here.
__all__ = [
    "DETACH_REASK_S",
    "LibvirtDriver",
    "cells_from_node_info",
    "classify_pci",
    "parse_capability_cells",
    "parse_pci_device",
    "read_tail",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

_POWER = {
    libvirt.VIR_DOMAIN_NOSTATE: PowerState.UNKNOWN,
    libvirt.VIR_DOMAIN_RUNNING: PowerState.RUNNING,
    libvirt.VIR_DOMAIN_BLOCKED: PowerState.RUNNING,  # running, waiting on I/O
    libvirt.VIR_DOMAIN_PAUSED: PowerState.PAUSED,
    libvirt.VIR_DOMAIN_SHUTDOWN: PowerState.RUNNING,  # still up while shutting down
    libvirt.VIR_DOMAIN_SHUTOFF: PowerState.SHUTOFF,
    libvirt.VIR_DOMAIN_CRASHED: PowerState.CRASHED,
    libvirt.VIR_DOMAIN_PMSUSPENDED: PowerState.PAUSED,
}
# "domain is already running" / "domain is not running": the goal is met, a race got there.
_ALREADY_DONE = {libvirt.VIR_ERR_OPERATION_INVALID}
_UNDEFINE_FLAGS = (
    libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
)


def _silence_libvirt_stderr() -> None:
    # libvirt prints every error to stderr by default; ours are raised as DriverError instead.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def _code(exc: libvirt.libvirtError) -> int | None:
    return exc.get_error_code()


def _call(what: str, fn: Callable[[], T]) -> T:
    """Run one libvirt call, turning ``libvirtError`` into the contract's errors."""
    try:
        return fn()
    except libvirt.libvirtError as exc:
        code = _code(exc)
        cls = GuestNotFound if code == libvirt.VIR_ERR_NO_DOMAIN else DriverError
        raise cls(f"{what}: {exc}", code=code) from exc


def _cpu_time(dom: libvirt.virDomain) -> int | None:
    """The guest's CPU time in ns (``virDomainGetInfo``; 0 when shut off). libvirt's test
    driver answers the wall clock for a running guest, so simulated guests look busy."""
    try:
        return int(dom.info()[4])
    except libvirt.libvirtError:
        return None


DETACH_REASK_S = 10.0  # how often a hot-unplug the guest has not completed is asked again


def _disk_targets(xml: str) -> dict[str, ET.Element]:
    """Every ``<disk>`` of a domain XML by its target dev."""
    found = {}
    for disk in ET.fromstring(xml).iterfind("devices/disk"):
        target = disk.find("target")
        if target is not None and target.get("dev"):
            found[target.get("dev")] = disk
    return found


def _find_disk(devices: ET.Element, target_dev: str) -> ET.Element:
    for disk in devices.iterfind("disk"):
        target = disk.find("target")
        if target is not None and target.get("dev") == target_dev:
            return disk
    raise DriverError(f"no disk {target_dev}")


class LibvirtDriver(HypervisorDriver):
    """Drives one libvirt connection. ``machine`` is the guest machine type (``q35`` suits
    PCIe pass-through); ``poll_interval_s`` paces the wait for a graceful shutdown."""

    def __init__(
        self,
        uri: str = "qemu:///system",
        *,
        machine: str = "q35",
        cpu_mode: str = "host-passthrough",
        cpu_disable: tuple[str, ...] = (),
        poll_interval_s: float = 0.5,
        detach_timeout_s: float = 30.0,
        accel: str = "kvm",
        host: str = "",
    ) -> None:
        _silence_libvirt_stderr()
        self.uri = uri
        self.machine = machine
        self.cpu_mode = cpu_mode
        self.cpu_disable = cpu_disable
        self.poll_interval_s = poll_interval_s
        self.detach_timeout_s = detach_timeout_s
        self._conn = _call(f"open {uri}", lambda: libvirt.open(uri))
        # ``accel`` (``compute.drivers.accel``): "kvm", or "tcg" for QEMU's emulation, whose
        # domains are type "qemu" and have no host CPU to pass through.
        # ``host``: this agent's Kumo host name, written into every domain it defines;
        # ``list_guests`` then leaves out domains another host's agent defined on the same
        # libvirt (agents of a test fleet, or a bench, sharing one libvirtd).
        self.host = host
        self.accel = "" if self._conn.getType().lower() == "test" else accel
        self._domain_type = {"": "test", "tcg": "qemu"}.get(self.accel, "kvm")
        if self.accel == "tcg":
            self.cpu_mode, self.cpu_disable = "", ()
        self._cells: tuple[NumaCell, ...] | None = None  # host_cells() cache

    @property
    def simulated(self) -> bool:
        """True on libvirt's test driver, which runs no guest and reads no disk."""
        return self._domain_type == "test"

    @property
    def connection(self) -> libvirt.virConnect:
        """The one connection of this driver, shared with the storage pool driver
        (``storage.drivers.pools``): the test driver keeps pools per connection."""
        return self._conn

    def close(self) -> None:
        try:
            self._conn.close()
        except libvirt.libvirtError:
            log.warning("closing libvirt connection %s failed", self.uri, exc_info=True)

    # -- helpers ----------------------------------------------------------------------------

    def _lookup(self, vm_id: str) -> libvirt.virDomain:
        name = domain_xml.domain_name(vm_id)
        return _call(f"lookup {name}", lambda: self._conn.lookupByName(name))

    def _lookup_or_none(self, vm_id: str) -> libvirt.virDomain | None:
        try:
            return self._lookup(vm_id)
        except GuestNotFound:
            return None

    @staticmethod
    def _inactive_xml(dom: libvirt.virDomain) -> str:
        return _call(f"read {dom.name()}", lambda: dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))

    @staticmethod
    def _power(dom: libvirt.virDomain) -> PowerState:
        state, _reason = _call(f"state of {dom.name()}", dom.state)
        return _POWER.get(state, PowerState.UNKNOWN)

    def _observe(self, dom: libvirt.virDomain, vm_id: str) -> GuestState:
        meta = domain_xml.parse_kumo_metadata(self._inactive_xml(dom))
        if meta is None or meta.vm_id != vm_id:
            raise DriverError(f"domain {dom.name()} exists but carries no Kumo metadata")
        return GuestState(vm_id=vm_id, generation=meta.generation, power=self._power(dom))

    def _cell_cpus(self, cell: int) -> list[int]:
        for numa_cell in self.host_cells():
            if numa_cell.id == cell and numa_cell.cpus:
                return list(numa_cell.cpus)
        raise DriverError(f"host has no NUMA cell {cell}")

    def _read_cells(self) -> tuple[NumaCell, ...]:
        try:
            cells = parse_capability_cells(_call("read capabilities", self._conn.getCapabilities))
        except (ET.ParseError, ValueError) as exc:
            raise DriverError(f"unreadable capabilities: {exc}") from exc
        if cells:
            return cells
        _model, memory_mib, cpus, _mhz, nodes, *_ = _call("read node info", self._conn.getInfo)
        return cells_from_node_info(cpus, memory_mib, nodes)

    def _read_devices(self) -> tuple[PciDevice, ...]:
        flags = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV
        found = []
        for dev in _call("list node devices", lambda: self._conn.listAllDevices(flags)):
            try:
                xml = dev.XMLDesc(0)
            except libvirt.libvirtError as exc:
                if _code(exc) == libvirt.VIR_ERR_NO_NODE_DEVICE:
                    continue  # unplugged between listing and reading
                raise DriverError(f"read node device {dev.name()}: {exc}", code=_code(exc)) from exc
            try:
                device = parse_pci_device(xml)
            except ValueError as exc:
                log.warning("node device %s skipped: %s", dev.name(), exc)
                continue
            if device.kind is not DeviceKind.OTHER:
                found.append(device)
        return tuple(sorted(found, key=lambda device: device.address))

    def _tolerate(self, what: str, fn: Callable[[], object]) -> None:
        """Run a state change whose goal a concurrent change may already have reached."""
        try:
            fn()
        except libvirt.libvirtError as exc:
            if _code(exc) in _ALREADY_DONE:
                log.info("%s: already done (%s)", what, exc)
                return
            cls = GuestNotFound if _code(exc) == libvirt.VIR_ERR_NO_DOMAIN else DriverError
            raise cls(f"{what}: {exc}", code=_code(exc)) from exc

    # -- contract ---------------------------------------------------------------------------

    def ensure_defined(self, spec: GuestSpec) -> GuestState:
        dom = self._lookup_or_none(spec.vm_id)
        if dom is not None:
            current = self._observe(dom, spec.vm_id)
            if current.generation >= spec.generation:
                if current.generation > spec.generation:
                    log.info(
                        "vm %s: stale generation %d ignored, %d in place",
                        spec.vm_id,
                        spec.generation,
                        current.generation,
                    )
                return current
        try:
            xml = domain_xml.build_domain_xml(
                spec,
                cells=self.host_cells(),
                domain_type=self._domain_type,
                machine=self.machine,
                cpu_mode=self.cpu_mode,
                cpu_disable=self.cpu_disable,
                host=self.host,
            )
        except ValueError as exc:  # a cell the host lacks, too many devices on one cell
            raise DriverError(f"vm {spec.vm_id}: {exc}") from exc
        dom = _call(f"define vm {spec.vm_id}", lambda: self._conn.defineXML(xml))
        log.info("vm %s: defined generation %d", spec.vm_id, spec.generation)
        return self._observe(dom, spec.vm_id)

    def ensure_running(self, vm_id: str) -> GuestState:
        dom = self._lookup(vm_id)
        power = self._power(dom)
        if power is PowerState.PAUSED:
            self._tolerate(f"resume vm {vm_id}", dom.resume)
        elif power is PowerState.CRASHED:
            self._tolerate(f"destroy crashed vm {vm_id}", dom.destroy)
            self._tolerate(f"start vm {vm_id}", dom.create)
        elif power is not PowerState.RUNNING:
            self._tolerate(f"start vm {vm_id}", dom.create)
        return self._observe(dom, vm_id)

    def ensure_stopped(self, vm_id: str, *, graceful_timeout_s: float) -> GuestState:
        dom = self._lookup(vm_id)
        power = self._power(dom)
        if power is PowerState.SHUTOFF:
            return self._observe(dom, vm_id)
        if power is PowerState.RUNNING and graceful_timeout_s > 0:
            self._tolerate(f"shut down vm {vm_id}", dom.shutdown)
            deadline = time.monotonic() + graceful_timeout_s
            while self._power(dom) is not PowerState.SHUTOFF and time.monotonic() < deadline:
                time.sleep(self.poll_interval_s)
        if self._power(dom) is not PowerState.SHUTOFF:
            log.info("vm %s: forcing off", vm_id)
            self._tolerate(f"destroy vm {vm_id}", dom.destroy)
        return self._observe(dom, vm_id)

    def ensure_absent(self, vm_id: str) -> None:
        dom = self._lookup_or_none(vm_id)
        if dom is None:
            return
        if domain_xml.parse_kumo_metadata(self._inactive_xml(dom)) is None:
            raise DriverError(f"domain {dom.name()} carries no Kumo metadata; not removing")
        try:
            if self._power(dom) is not PowerState.SHUTOFF:
                self._tolerate(f"destroy vm {vm_id}", dom.destroy)
            self._tolerate(f"undefine vm {vm_id}", lambda: dom.undefineFlags(_UNDEFINE_FLAGS))
        except GuestNotFound:
            return  # removed concurrently: the goal is met
        log.info("vm %s: removed", vm_id)

    def get_guest(self, vm_id: str) -> GuestState:
        return self._observe(self._lookup(validate_vm_id(vm_id)), vm_id)

    def list_guests(self) -> list[GuestState]:
        guests = []
        for dom in _call("list domains", lambda: self._conn.listAllDomains(0)):
            try:
                meta = domain_xml.parse_kumo_metadata(self._inactive_xml(dom))
                if meta is None or dom.name() != domain_xml.domain_name(meta.vm_id):
                    continue
                if self.host and meta.host and meta.host != self.host:
                    continue  # another agent's guest on a libvirt shared with it
                guests.append(
                    GuestState(meta.vm_id, meta.generation, self._power(dom), _cpu_time(dom))
                )
            except GuestNotFound:
                continue  # vanished between listing and reading
            except ValueError:
                continue  # metadata with a vm_id Kumo never issues: not ours
        return sorted(guests, key=lambda guest: guest.vm_id)

    # -- volumes, live ----------------------------------------------------------------------
    # libvirt's test driver has no device hot-plug: on a simulated host these change the
    # definition only, by redefining it.

    def _running(self, dom: libvirt.virDomain) -> bool:
        return self._power(dom) in (PowerState.RUNNING, PowerState.PAUSED)

    def _live_xml(self, dom: libvirt.virDomain) -> str:
        return _call(f"read {dom.name()}", lambda: dom.XMLDesc(0))

    def _redefine(self, dom: libvirt.virDomain, change: Callable[[ET.Element], None]) -> None:
        root = ET.fromstring(self._inactive_xml(dom))
        change(root.find("devices"))
        xml = ET.tostring(root, encoding="unicode")
        _call(f"redefine {dom.name()}", lambda: self._conn.defineXML(xml))

    def volume_disks(self, vm_id: str) -> dict[str, tuple[str, str, str]]:
        dom = self._lookup(vm_id)
        live = self._running(dom) and not self.simulated
        return domain_xml.volume_disks(self._live_xml(dom) if live else self._inactive_xml(dom))

    def ensure_disk_attached(self, vm_id: str, disk: DiskSpec) -> None:
        dom = self._lookup(vm_id)
        element = domain_xml.disk_element(disk)
        flags = 0
        if disk.target_dev not in _disk_targets(self._inactive_xml(dom)):
            flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
        live = self._running(dom) and not self.simulated
        if live and disk.target_dev not in _disk_targets(self._live_xml(dom)):
            flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
        if not flags:
            return
        if self.simulated:
            self._redefine(dom, lambda devices: devices.append(element))
        else:
            xml = ET.tostring(element, encoding="unicode")
            _call(
                f"attach {disk.target_dev} to vm {vm_id}",
                lambda: dom.attachDeviceFlags(xml, flags),
            )
        log.info("vm %s: attached %s (%s, flags %d)", vm_id, disk.target_dev, disk.source, flags)

    def ensure_disk_detached(self, vm_id: str, target_dev: str) -> None:
        dom = self._lookup(vm_id)
        configured = _disk_targets(self._inactive_xml(dom)).get(target_dev)
        if configured is not None:
            if self.simulated:
                self._redefine(dom, lambda devices: devices.remove(_find_disk(devices, target_dev)))
            else:
                xml = ET.tostring(configured, encoding="unicode")
                _call(
                    f"detach {target_dev} from the definition of vm {vm_id}",
                    lambda: dom.detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_CONFIG),
                )
        if not self._running(dom) or self.simulated:
            return
        attached = _disk_targets(self._live_xml(dom)).get(target_dev)
        if attached is None:
            return
        xml = ET.tostring(attached, encoding="unicode")
        _call(
            f"detach {target_dev} from vm {vm_id}",
            lambda: dom.detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE),
        )
        deadline = time.monotonic() + self.detach_timeout_s
        ask_again = time.monotonic() + DETACH_REASK_S
        while target_dev in _disk_targets(self._live_xml(dom)):
            now = time.monotonic()
            if now > deadline:
                raise DriverError(
                    f"vm {vm_id}: the guest has not released {target_dev} within "
                    f"{self.detach_timeout_s:.0f} s"
                )
            if now > ask_again:  # a guest still booting may have missed the request
                ask_again = now + DETACH_REASK_S
                try:
                    dom.detachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
                except libvirt.libvirtError as exc:
                    log.info("vm %s: asking again to release %s: %s", vm_id, target_dev, exc)
            time.sleep(self.poll_interval_s)
        log.info("vm %s: detached %s", vm_id, target_dev)

    def ensure_disk_size(self, vm_id: str, target_dev: str, size_bytes: int) -> int:
        dom = self._lookup(vm_id)
        if not self._running(dom) or self.simulated:
            return 0
        info = _call(f"size of {target_dev} of vm {vm_id}", lambda: dom.blockInfo(target_dev))
        capacity = info[0]
        if capacity < size_bytes:
            _call(
                f"grow {target_dev} of vm {vm_id}",
                lambda: dom.blockResize(
                    target_dev, size_bytes, libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES
                ),
            )
            log.info("vm %s: %s grown live to %d bytes", vm_id, target_dev, size_bytes)
            capacity = size_bytes
        return capacity

    def domain_xml(self, vm_id: str) -> str:
        return self._inactive_xml(self._lookup(vm_id))

    def reset(self, vm_id: str) -> GuestState:
        dom = self._lookup(validate_vm_id(vm_id))
        if self._power(dom) is PowerState.RUNNING:
            log.info("vm %s: hard reset", vm_id)
            self._tolerate(f"reset vm {vm_id}", lambda: dom.reset(0))
        return self._observe(dom, vm_id)

    def console_log(self, vm_id: str, max_bytes: int = 65536) -> bytes:
        """The tail of the serial console's log file (named in the domain's
        ``<serial><log file=…>``; virtlogd writes it, and its rotated ``.0`` is read too
        when the current file is shorter than asked)."""
        path = domain_xml.console_log_path(self._inactive_xml(self._lookup(vm_id)))
        if not path or max_bytes <= 0:
            return b""
        return read_tail([f"{path}.0", path], max_bytes)

    def host_inventory(self) -> HostInventory:
        """Read afresh on every call (and refreshes the ``host_cells()`` cache). Cells come
        from the capabilities, or from ``getInfo()`` when those list none (see
        ``cells_from_node_info``). Devices are sorted by PCI address; bridges and other
        functions Kumo does not schedule are left out."""
        _model, memory_mib, cpus, _mhz, _nodes, *_ = _call("read node info", self._conn.getInfo)
        self._cells = self._read_cells()
        return HostInventory(
            cpus=cpus,
            memory_mib=memory_mib,
            cells=self._cells,
            devices=self._read_devices(),
            hypervisor=_call("read hypervisor type", self._conn.getType),
            accel=self.accel,
        )

    # -- host topology ----------------------------------------------------------------------

    def host_cells(self) -> tuple[NumaCell, ...]:
        """The host's NUMA cells, sorted by id, each with its CPU ids; the same source
        ``host_inventory()`` and NUMA pinning use. Read once per driver and cached: topology
        does not change while the agent runs."""
        if self._cells is None:
            self._cells = self._read_cells()
        return self._cells


def read_tail(paths: list[str], max_bytes: int) -> bytes:
    """The last ``max_bytes`` of ``paths`` read as one stream, oldest first; a missing file
    counts as empty. Reads at most ``max_bytes`` from each file."""
    out = b""
    for path in reversed(paths):
        if len(out) >= max_bytes:
            break
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                want = max_bytes - len(out)
                f.seek(max(0, size - want))
                out = f.read(want) + out
        except FileNotFoundError:
            continue
        except OSError as e:
            raise DriverError(f"console log {path}: {e}") from e
    return out[-max_bytes:]
