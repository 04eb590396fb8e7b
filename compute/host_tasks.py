"""The compute side of the host agent: Celery tasks on ``host.<name>`` and periodic reports.

No Django here. Every task is idempotent on (vm id, generation): the generation a guest
was last defined with lives in its libvirt metadata, a task older than that changes
nothing, and every step (define, start, stop, remove) is an ``ensure_*`` whose repeat is
harmless. Whatever happens, the task reports what the host now holds, so the controller
never has to trust a message got through: the periodic guests report catches the rest.

A guest's tap NICs need their host tap devices before it starts (libvirt opens them and
never makes them): on a real host the task makes any that are missing, through the network
driver's netlink module; the network agent bridges them. A simulated host touches no host
network.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

from celery import shared_task

from compute.drivers import cloudinit, nccl
from compute.drivers.base import (
    DeviceKind,
    DiskSpec,
    DriverError,
    GuestNic,
    GuestNotFound,
    GuestSpec,
    HypervisorDriver,
    NicKind,
    PassthroughDevice,
    PciAddress,
    PowerState,
)
from compute.protocol import (
    ABSENT,
    GUESTS_LIST_TASK,
    GUESTS_REPORT,
    INVENTORY_REPORT,
    VM_APPLY_TASK,
    VM_DESCRIBE_TASK,
    VM_OBSERVED_REPORT,
    VmApply,
    inventory_payload,
)
from controlplane.agent import reports, runtime
from network.drivers.base import NetworkDriverError
from network.drivers.netlink import Netlink
from storage.drivers.base import StorageError
from storage.host_tasks import prepare_volumes

log = logging.getLogger(__name__)

_driver: HypervisorDriver | None = None
_driver_lock = threading.Lock()
# One guest is changed by one task at a time; different guests proceed in parallel.
_guest_locks: dict[str, threading.Lock] = {}


def driver() -> HypervisorDriver:
    """This agent's one hypervisor connection (libvirt's test driver keeps its guests per
    connection, so a simulated host must never open a second one)."""
    global _driver
    with _driver_lock:
        if _driver is None:
            from compute.drivers.libvirt import LibvirtDriver

            config = runtime.config()
            _driver = LibvirtDriver(
                config.libvirt_uri,
                cpu_mode=config.guest_cpu_mode,
                cpu_disable=config.guest_cpu_disable,
            )
        return _driver


def _guest_lock(vm_id: str) -> threading.Lock:
    with _driver_lock:
        return _guest_locks.setdefault(vm_id, threading.Lock())


def instance_dir(vm_id: str) -> Path:
    return runtime.config().instances_dir / vm_id


# --- building a guest ----------------------------------------------------------------------


def _devices(message: VmApply) -> tuple[PassthroughDevice, ...]:
    return tuple(
        PassthroughDevice(
            address=PciAddress.parse(d.address),
            kind=DeviceKind(d.kind),
            numa_node=d.numa_node,
            class_code=d.class_code,
            vendor_id=d.vendor_id,
            product_id=d.product_id,
        )
        for d in message.devices
    )


def _nics(message: VmApply) -> tuple[GuestNic, ...]:
    return tuple(
        GuestNic(
            mac=i.mac.lower(),
            mtu=i.mtu,
            kind=NicKind(i.kind),
            device=i.device,
            pci_address=PciAddress.parse(i.pci_address) if i.pci_address else None,
            addresses=i.addresses,
            gateway=i.gateway,
            dns=i.dns,
        )
        for i in message.interfaces
    )


def _root_disk(message: VmApply, hv: HypervisorDriver) -> DiskSpec:
    """The guest's root disk: a qcow2 overlay on the image, made once per VM.

    On a simulated host (libvirt's test driver reads no disk) nothing is copied and the
    domain names the overlay path only; a real host needs the image in its store.
    """
    path = instance_dir(message.vm_id) / "root.qcow2"
    if getattr(hv, "simulated", False) or path.exists():
        return DiskSpec(source=str(path), format="qcow2")
    if not Path(message.image_location).exists():
        raise DriverError(f"image {message.image_location} is not in this host's store")
    qemu_img = shutil.which("qemu-img")
    if qemu_img is None:
        raise DriverError("qemu-img is not installed on this host")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    subprocess.run(
        [
            qemu_img,
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            message.image_format,
            "-b",
            message.image_location,
            str(partial),
            f"{message.disk_gib}G",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    os.replace(partial, path)
    return DiskSpec(source=str(path), format="qcow2")


def guest_spec(message: VmApply, hv: HypervisorDriver) -> GuestSpec:
    """The driver's spec for ``message``, with its cloud-init seed written (NCCL topology
    included for GPU guests, network configuration for guests with NICs)."""
    spec = GuestSpec(
        vm_id=message.vm_id,
        generation=message.generation,
        name=message.name,
        vcpus=message.vcpus,
        memory_mib=message.memory_mib,
        numa_cell=message.numa_cell,
        devices=_devices(message),
        nics=_nics(message),
    )
    files = {}
    if spec.gpus:
        files = nccl.guest_files(spec)
    seed = cloudinit.write_seed(
        instance_dir(message.vm_id) / "seed.iso",
        instance_id=message.vm_id,
        hostname=message.hostname,
        ssh_keys=list(message.ssh_keys),
        user_data=message.user_data,
        files=files,
        nics=spec.nics,
        mounts=[(m.source, m.mount_point, m.fstype, m.options) for m in message.mounts],
        private_files=metadata_files(message),
    )
    volumes = prepare_volumes(message.volumes, hv)
    return replace(spec, disks=(_root_disk(message, hv), *volumes), seed_iso=str(seed))


METADATA_ENV = "/etc/kumo/metadata.env"


def metadata_files(message: VmApply) -> dict[str, str]:
    """The guest's metadata endpoint and token (``/etc/kumo/metadata.env``, root only): a
    spot guest polls ``$KUMO_METADATA_URL/spot/instance-action`` with header
    ``X-Kumo-Metadata-Token: $KUMO_METADATA_TOKEN``."""
    meta = message.extra.get("metadata") or {}
    if not meta.get("token"):
        return {}
    return {
        METADATA_ENV: f"KUMO_METADATA_URL={meta.get('url', '')}\n"
        f"KUMO_METADATA_TOKEN={meta['token']}\n"
    }


def ensure_taps(nics: tuple[GuestNic, ...], nl: Netlink) -> list[str]:
    """Make the host tap device of every tap NIC in ``nics`` that lacks one, and return the
    names made. A tap made here is persistent (it outlives the guest's QEMU), down and on no
    bridge, as the network agent makes its own, which then bridges it and brings it up.
    One link dump; a tap someone made meanwhile ("already exists") is success; any other
    refusal is a ``DriverError``."""
    present = nl.links()
    made = []
    for nic in nics:
        if nic.kind is not NicKind.TAP or nic.device in present:
            continue
        try:
            nl.add_tap(nic.device)
        except NetworkDriverError as e:
            if e.errno != errno.EEXIST:
                raise DriverError(f"tap {nic.device}: {e}") from e
            continue
        made.append(nic.device)
    return made


def _prepare_host_network(spec: GuestSpec, hv: HypervisorDriver) -> None:
    """On a real host, the taps ``spec``'s guest opens when it starts; nothing on a simulated
    host (libvirt's test driver opens no tap)."""
    if getattr(hv, "simulated", False) or not any(n.kind is NicKind.TAP for n in spec.nics):
        return
    nl = Netlink()
    try:
        made = ensure_taps(spec.nics, nl)
    finally:
        nl.close()
    if made:
        log.info("vm %s generation %d: made taps %s", spec.vm_id, spec.generation, made)


# --- tasks ---------------------------------------------------------------------------------


def _observed(message: VmApply, *, generation: int, power: str, ok: bool = True, error=""):
    reports.send(
        runtime.config().host,
        VM_OBSERVED_REPORT,
        {
            "vm_id": message.vm_id,
            "generation": generation,
            "power": power,
            "ok": ok,
            "error": error,
            "operation_id": message.operation_id,
        },
    )


def apply(message: VmApply, hv: HypervisorDriver) -> tuple[int, str]:
    """Converge one guest to ``message``; returns the (generation, power) it ends at."""
    if message.desired == ABSENT:
        hv.ensure_absent(message.vm_id)
        shutil.rmtree(instance_dir(message.vm_id), ignore_errors=True)
        return message.generation, ABSENT
    try:
        current = hv.get_guest(message.vm_id)
    except GuestNotFound:
        current = None
    if current is not None and current.generation > message.generation:
        log.info(
            "vm %s: generation %d is stale, %d in place",
            message.vm_id,
            message.generation,
            current.generation,
        )
        return current.generation, current.power.value
    first_apply = current is None or current.generation < message.generation
    spec = guest_spec(message, hv)
    state = hv.ensure_defined(spec)
    if message.desired == "running":
        if message.reboot and first_apply and state.power is PowerState.RUNNING:
            hv.ensure_stopped(message.vm_id, graceful_timeout_s=message.graceful_timeout_s)
        _prepare_host_network(spec, hv)
        state = hv.ensure_running(message.vm_id)
    else:
        state = hv.ensure_stopped(message.vm_id, graceful_timeout_s=message.graceful_timeout_s)
    log.info("vm %s generation %d: %s", message.vm_id, state.generation, state.power.value)
    return state.generation, state.power.value


@shared_task(name=VM_APPLY_TASK, acks_late=True, time_limit=900, ignore_result=True)
def vm_apply(**wire) -> None:
    """Make the guest what the controller asked (``compute.protocol.VmApply``), then say
    what it is. A driver error is reported, not retried here: the controller decides."""
    message = VmApply.from_wire(wire)
    with _guest_lock(message.vm_id):
        try:
            generation, power = apply(message, driver())
        except (
            DriverError,
            StorageError,
            OSError,
            subprocess.SubprocessError,
            ValueError,
        ) as e:
            log.warning("vm %s generation %d failed: %s", message.vm_id, message.generation, e)
            _observed(
                message,
                generation=message.generation,
                power=PowerState.UNKNOWN.value,
                ok=False,
                error=str(e),
            )
            return
    _observed(message, generation=generation, power=power)


@shared_task(name=VM_DESCRIBE_TASK, acks_late=True, time_limit=60, ignore_result=True)
def vm_describe(*, vm_id: str, operation_id: str) -> None:
    """Answer an operator's question: the guest's domain XML as libvirt holds it."""
    host = runtime.config().host
    try:
        hv = driver()
        state = hv.get_guest(vm_id)
        result = {
            "generation": state.generation,
            "power": state.power.value,
            "domain_xml": hv.domain_xml(vm_id),
        }
    except DriverError as e:
        reports.operation_result(
            host, operation_id, ok=False, error_code="host_error", error_message=str(e)
        )
        return
    reports.operation_result(host, operation_id, ok=True, result=result)


@shared_task(name=GUESTS_LIST_TASK, acks_late=True, time_limit=60, ignore_result=True)
def guests_list(*, operation_id: str) -> None:
    """Answer an operator's question: every Kumo guest on this host, read from libvirt."""
    host = runtime.config().host
    try:
        guests = [_guest_wire(g) for g in driver().list_guests()]
    except DriverError as e:
        reports.operation_result(
            host, operation_id, ok=False, error_code="host_error", error_message=str(e)
        )
        return
    reports.operation_result(host, operation_id, ok=True, result={"guests": guests})


def _guest_wire(guest) -> dict:
    wire = {"vm_id": guest.vm_id, "generation": guest.generation, "power": guest.power.value}
    if getattr(guest, "cpu_time_ns", None) is not None:
        wire["cpu_time_ns"] = guest.cpu_time_ns
    return wire


# --- periodic reports ----------------------------------------------------------------------


def inventory_report() -> None:
    """Send the host's inventory to the controller."""
    payload = inventory_payload(driver().host_inventory())
    reports.send(runtime.config().host, INVENTORY_REPORT, payload)


def guests_report() -> None:
    """Send every Kumo guest this host holds; the controller reconciles against it."""
    guests = [_guest_wire(g) for g in driver().list_guests()]
    reports.send(runtime.config().host, GUESTS_REPORT, {"guests": guests})
