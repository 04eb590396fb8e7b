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
    DriverError,
    GuestNotFound,
    GuestSpec,
    GuestState,
    HypervisorDriver,
    PowerState,
    validate_vm_id,
)

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


class LibvirtDriver(HypervisorDriver):
    """Drives one libvirt connection. ``machine`` is the guest machine type (``q35`` suits
    PCIe pass-through); ``poll_interval_s`` paces the wait for a graceful shutdown."""

    def __init__(
        self, uri: str = "qemu:///system", *, machine: str = "q35", poll_interval_s: float = 0.5
    ) -> None:
        _silence_libvirt_stderr()
        self.uri = uri
        self.machine = machine
        self.poll_interval_s = poll_interval_s
        self._conn = _call(f"open {uri}", lambda: libvirt.open(uri))
        self._domain_type = "test" if self._conn.getType().lower() == "test" else "kvm"

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
        caps = ET.fromstring(_call("read capabilities", self._conn.getCapabilities))
        cpus = caps.findall(f"host/topology/cells/cell[@id='{cell}']/cpus/cpu")
        if not cpus:
            raise DriverError(f"host has no NUMA cell {cell}")
        return [int(cpu.get("id", "-1")) for cpu in cpus]

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
        cell_cpus = self._cell_cpus(spec.numa_cell) if spec.numa_cell is not None else ()
        xml = domain_xml.build_domain_xml(
            spec, domain_type=self._domain_type, machine=self.machine, cell_cpus=cell_cpus
        )
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
                guests.append(GuestState(meta.vm_id, meta.generation, self._power(dom)))
            except GuestNotFound:
                continue  # vanished between listing and reading
            except ValueError:
                continue  # metadata with a vm_id Kumo never issues: not ours
        return sorted(guests, key=lambda guest: guest.vm_id)

    def domain_xml(self, vm_id: str) -> str:
        return self._inactive_xml(self._lookup(vm_id))
