"""An in-memory ``HypervisorDriver`` that keeps real state, for tests and local development.

It accounts what a host would: defined guests with their definitions and generations, power
state, and which GPUs running guests hold (a GPU can be attached to one running guest only,
as VFIO enforces). ``fail_next`` injects failures on chosen calls, so callers' error paths can
be tested without a broken host.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from compute.drivers import domain_xml
from compute.drivers.base import (
    DriverError,
    GuestNotFound,
    GuestSpec,
    GuestState,
    HypervisorDriver,
    PciAddress,
    PowerState,
    validate_vm_id,
)

# Mirrors libvirt's test:///default host: two NUMA cells of eight CPUs.
DEFAULT_CELLS: Mapping[int, tuple[int, ...]] = {0: tuple(range(8)), 1: tuple(range(8, 16))}


@dataclass
class _Guest:
    spec: GuestSpec
    power: PowerState = PowerState.SHUTOFF


class FakeDriver(HypervisorDriver):
    """Thread-safe in-memory host. ``cells`` maps NUMA cell ids to host CPU ids."""

    def __init__(self, *, cells: Mapping[int, Iterable[int]] = DEFAULT_CELLS) -> None:
        self.cells = {cell: tuple(cpus) for cell, cpus in cells.items()}
        self._guests: dict[str, _Guest] = {}
        self._foreign: set[str] = set()  # domain names that exist but are not Kumo's
        self._failures: dict[str, deque[BaseException]] = defaultdict(deque)
        self._lock = threading.RLock()
        self.calls: list[tuple[str, str]] = []  # (method, vm_id), for assertions

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
            return self._state(guest)

    def ensure_stopped(self, vm_id: str, *, graceful_timeout_s: float) -> GuestState:
        with self._lock:
            self._enter("ensure_stopped", vm_id)
            guest = self._get(vm_id)
            guest.power = PowerState.SHUTOFF
            return self._state(guest)

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

    def domain_xml(self, vm_id: str) -> str:
        with self._lock:
            self._enter("domain_xml", vm_id)
            spec = self._get(vm_id).spec
            cpus = self.cells[spec.numa_cell] if spec.numa_cell is not None else ()
            return domain_xml.build_domain_xml(spec, cell_cpus=cpus)

    # -- fake-only controls -----------------------------------------------------------------

    def add_foreign_domain(self, name: str) -> None:
        """Simulate a domain someone else defined on the host (no Kumo metadata)."""
        with self._lock:
            self._foreign.add(name)

    def set_power(self, vm_id: str, power: PowerState) -> None:
        """Simulate what happens behind the agent's back (a guest crash, a pause)."""
        with self._lock:
            self._get(vm_id).power = power
