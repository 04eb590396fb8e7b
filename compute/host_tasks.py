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

import contextlib
import errno
import logging
import os
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

from celery import shared_task

from compute.drivers import cloudinit, nccl, spotwatch
from compute.drivers.applied import Applied, AppliedStore
from compute.drivers.base import (
    DeviceKind,
    DiskSpec,
    DriverError,
    GuestNic,
    GuestNotFound,
    GuestSpec,
    GuestState,
    HypervisorDriver,
    NicKind,
    PassthroughDevice,
    PciAddress,
    PowerState,
)
from compute.drivers.imagecache import ImageCache, ImageCacheError, backing_file
from compute.protocol import (
    ABSENT,
    CONSOLE_LOG_MAX_BYTES,
    GUESTS_LIST_TASK,
    GUESTS_REPORT,
    INVENTORY_REPORT,
    VM_APPLY_TASK,
    VM_CONSOLE_LOG_TASK,
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

_locks_lock = threading.Lock()
# One guest is changed by one task at a time; different guests proceed in parallel.
_guest_locks: dict[str, threading.Lock] = {}


def driver() -> HypervisorDriver:
    """This agent's one hypervisor connection (``controlplane.agent.runtime``)."""
    return runtime.hypervisor()


def applied_store() -> AppliedStore:
    """This agent's record of the last generation applied to each guest, removals included."""
    return AppliedStore(runtime.config().applied_dir)


def _guest_lock(vm_id: str) -> threading.Lock:
    with _locks_lock:
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
            search=i.search,
        )
        for i in message.interfaces
    )


def _image_path(message: VmApply) -> str:
    """The local path of the guest's image: its verified copy in this host's image cache
    (fetched on first use), or, for an image pre-staged on every host, its location."""
    if not message.image_url:
        if not Path(message.image_location).exists():
            raise DriverError(f"image {message.image_location} is not in this host's store")
        return message.image_location
    cache = ImageCache(runtime.config().image_cache_dir)
    try:
        path = cache.ensure(
            checksum=message.image_checksum, size=message.image_size, url=message.image_url
        )
    except ImageCacheError as e:
        raise DriverError(f"image {message.image_checksum}: {e}") from e
    return str(path)


def _qemu_img() -> str:
    """The path of ``qemu-img``, which a real host's root disks are made and kept with."""
    qemu_img = shutil.which("qemu-img")
    if qemu_img is None:
        raise DriverError("qemu-img is not installed on this host")
    return qemu_img


def _root_disk(message: VmApply, hv: HypervisorDriver) -> DiskSpec:
    """The guest's root disk: a qcow2 overlay on the image's cached copy, made once per VM.

    On a simulated host (libvirt's test driver reads no disk) nothing is fetched or copied
    and the domain names the overlay path only.
    """
    kept = message.extra.get("root_disk")
    if kept:  # an unshelved VM boots its kept disk, in the shelve store every host reaches
        if not getattr(hv, "simulated", False) and not Path(kept).exists():
            raise DriverError(f"kept disk {kept} is not in this host's shelve store")
        return DiskSpec(source=kept, format="qcow2")
    path = instance_dir(message.vm_id) / "root.qcow2"
    if getattr(hv, "simulated", False) or path.exists():
        return DiskSpec(source=str(path), format="qcow2")
    backing = _image_path(message)
    qemu_img = _qemu_img()
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
            backing,
            str(partial),
            f"{message.disk_gib}G",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    os.replace(partial, path)
    return DiskSpec(source=str(path), format="qcow2")


#: How long writing a kept disk may take: below ``vm_apply``'s time limit, so a slow store
#: fails the task with an error the controller hears, not a killed worker.
KEEP_ROOT_DISK_TIMEOUT_S = 840


def keep_root_disk(vm_id: str, kept: str, hv: HypervisorDriver) -> None:
    """Write the guest's root disk to ``kept`` (shelve) as one qcow2 file that stands alone:
    its instance overlay and the image the overlay is based on, merged (``qemu-img
    convert``). Any host then boots it, whether or not it has that image cached (a host's
    image cache is its own, at a path named after the host, and its copies may be removed),
    and whether or not the image still exists. Written beside the target and renamed into
    place, so a failed write leaves no kept disk; nothing is done when the target is there
    already (a repeated task, or a VM that booted from its kept disk). On a simulated host
    no disk exists: the controller records ``kept`` on the VM, and that is the record."""
    source = instance_dir(vm_id) / "root.qcow2"
    target = Path(kept)
    if getattr(hv, "simulated", False) or target.exists() or not source.exists():
        return
    qemu_img = _qemu_img()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    subprocess.run(
        [qemu_img, "convert", "-q", "-O", "qcow2", str(source), str(partial)],
        check=True,
        capture_output=True,
        timeout=KEEP_ROOT_DISK_TIMEOUT_S,
    )
    os.replace(partial, target)
    log.info("vm %s: root disk kept at %s", vm_id, target)


def guest_spec(message: VmApply, hv: HypervisorDriver) -> GuestSpec:
    """The driver's spec for ``message``, with its cloud-init seed written (NCCL topology
    included for GPU guests, network configuration for guests with NICs)."""
    spec = GuestSpec(
        vm_id=message.vm_id,
        generation=message.generation,
        name=message.name,
        console_log=str(instance_dir(message.vm_id) / "console.log"),
        vcpus=message.vcpus,
        memory_mib=message.memory_mib,
        numa_cell=message.numa_cell,
        devices=_devices(message),
        nics=_nics(message),
    )
    files = {}
    if spec.gpus:
        files = nccl.guest_files(spec)
    private = metadata_files(message)
    commands = []
    if private:  # a guest that can ask the metadata endpoint watches for scheduled stops
        files = {**files, **spotwatch.guest_files()}
        commands.append(spotwatch.ENABLE)
    seed = cloudinit.write_seed(
        instance_dir(message.vm_id) / "seed.iso",
        instance_id=message.vm_id,
        hostname=message.hostname,
        ssh_keys=list(message.ssh_keys),
        user_data=message.user_data,
        files=files,
        nics=spec.nics,
        mounts=[(m.source, m.mount_point, m.fstype, m.options) for m in message.mounts],
        private_files=private,
        commands=commands,
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


def ensure_taps(
    nics: tuple[GuestNic, ...], nl: Netlink, *, replace_held: bool = False
) -> list[str]:
    """Make the host tap device of every tap NIC in ``nics`` that lacks one, and return the
    names made. A tap made here is persistent (it outlives the guest's QEMU), down and on no
    bridge, as the network agent makes its own, which then bridges it and brings it up.
    One link dump; a tap someone made meanwhile ("already exists") is success; any other
    refusal is a ``DriverError``.

    ``replace_held``: the guest is off and about to start. A tap of its that an open file
    still holds (its carrier is on: a QEMU that has not let go of it yet) would refuse the
    new QEMU's open with EBUSY; it is deleted and made again, and its holders are logged.
    No other guest can hold it: a tap is named after one port of one VM."""
    present = nl.links()
    made = []
    for nic in nics:
        if nic.kind is not NicKind.TAP:
            continue
        link = present.get(nic.device)
        if link is not None and replace_held and link.carrier:
            log.warning(
                "tap %s is held while its guest is off (by %s): made again",
                nic.device,
                ", ".join(tap_holders(nic.device)) or "no process: the kernel",
            )
            try:
                nl.delete_link(link.index, nic.device)
            except NetworkDriverError as e:
                raise DriverError(f"tap {nic.device}: {e}") from e
            link = None
        if link is not None:
            continue
        try:
            nl.add_tap(nic.device)
        except NetworkDriverError as e:
            if e.errno != errno.EEXIST:
                raise DriverError(f"tap {nic.device}: {e}") from e
            continue
        made.append(nic.device)
    return made


def tap_holders(name: str) -> list[str]:
    """The processes holding a tap named ``name`` open, as "pid (command)": those with a
    file whose fdinfo names it. Read only to say so in the log: it walks every process's
    files."""
    holders = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and any(
            f"iff:\t{name}\n" in _read(info) for info in _listed(proc / "fdinfo")
        ):
            holders.append(f"{proc.name} ({_read(proc / 'comm').strip()})")
    return holders


def _listed(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []  # its process is gone, or not ours to read


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""  # closed, or its process gone, while read


def _prepare_host_network(
    spec: GuestSpec, hv: HypervisorDriver, *, replace_held: bool
) -> list[str]:
    """On a real host, the taps ``spec``'s guest opens when it starts (``ensure_taps``);
    returns the names made. Nothing on a simulated host (libvirt's test driver opens no
    tap)."""
    if getattr(hv, "simulated", False) or not any(n.kind is NicKind.TAP for n in spec.nics):
        return []
    nl = Netlink()
    try:
        made = ensure_taps(spec.nics, nl, replace_held=replace_held)
    finally:
        nl.close()
    if made:
        log.info("vm %s generation %d: made taps %s", spec.vm_id, spec.generation, made)
    return made


def start_guest(spec: GuestSpec, hv: HypervisorDriver, *, off: bool) -> GuestState:
    """Start ``spec``'s guest (``off``: it is not running now) with its taps ready. A start
    of a guest that was off refused over one of its taps (the refusal names it, or the tap
    is held: a holder that took it after ``ensure_taps`` looked, or let go of it late) has
    its held taps made again and is tried once more; any other refusal is the caller's."""
    _prepare_host_network(spec, hv, replace_held=off)
    try:
        return hv.ensure_running(spec.vm_id)
    except DriverError as e:
        if not off:
            raise
        remade = _prepare_host_network(spec, hv, replace_held=True)
        taps = [nic.device for nic in spec.nics if nic.kind is NicKind.TAP]
        if not remade and not any(name in str(e) for name in taps):
            raise
        log.warning("vm %s: start refused over a tap (%s); started again", spec.vm_id, e)
        return hv.ensure_running(spec.vm_id)


def _taps_go_to_netns(spec: GuestSpec, hv: HypervisorDriver) -> str:
    """The network namespace this host's tenant network lives in when it is not the one
    libvirt and QEMU run in (a real guest on a simulated host), else ""."""
    netns = runtime.config().network_netns
    if getattr(hv, "simulated", False) or not netns:
        return ""
    return netns if any(n.kind is NicKind.TAP for n in spec.nics) else ""


def hand_taps_to_netns(spec: GuestSpec, netns: str) -> list[str]:
    """Move the taps of ``spec``'s just-started guest from the namespace QEMU opened them
    in into the host's network namespace ``netns``, and have the network side bridge them
    at once. QEMU keeps its file descriptor across the move, so the guest's NIC now sits on
    the host's overlay. A same-named tap there (the network side makes one for every tap
    port it is told of, and a stopped guest leaves its own) holds no guest and is replaced.
    Returns the names moved; a repeat moves nothing. Holds the network side's lock, so its
    resyncs never race the swap."""
    from network import host_tasks as network_tasks

    here, there = Netlink(), Netlink(netns)
    moved = []
    try:
        with network_tasks.exclusive():
            mine, theirs = here.links(), there.links()
            for nic in spec.nics:
                if nic.kind is not NicKind.TAP or nic.device not in mine:
                    continue
                try:
                    if nic.device in theirs:
                        there.delete_link(theirs[nic.device].index, nic.device)
                    here.move_to_netns(mine[nic.device].index, nic.device, netns)
                except NetworkDriverError as e:
                    raise DriverError(f"tap {nic.device} into {netns}: {e}") from e
                moved.append(nic.device)
    finally:
        here.close()
        there.close()
    if moved:
        log.info("vm %s: taps %s moved into %s", spec.vm_id, moved, netns)
        if network_tasks.enabled():
            network_tasks.network_report()  # resync now: the taps join their bridges
    return moved


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


def converge_volumes(spec: GuestSpec, hv: HypervisorDriver) -> None:
    """Make a running guest's volumes those of ``spec`` at once, live and in its
    definition: detach what it should no longer have, attach what it lacks, grow what grew.
    Every step is an idempotent ``ensure_*``."""
    wanted = {d.target_dev: d for d in spec.disks if d.pool}
    for target, (pool, volume, _serial) in hv.volume_disks(spec.vm_id).items():
        disk = wanted.get(target)
        if disk is None or (disk.pool, disk.source) != (pool, volume):
            hv.ensure_disk_detached(spec.vm_id, target)
    for disk in wanted.values():
        hv.ensure_disk_attached(spec.vm_id, disk)
        if disk.size_bytes:
            hv.ensure_disk_size(spec.vm_id, disk.target_dev, disk.size_bytes)


def _superseded(message: VmApply, held: Applied | None) -> bool:
    """Whether this host already applied something newer for the guest than ``message``:
    a removal at the same or a later generation (a tombstone), or any later generation."""
    if held is None:
        return False
    if held.absent and message.desired != ABSENT:
        return message.generation <= held.generation
    return message.generation < held.generation


def _as_held(message: VmApply, held: Applied | None, hv: HypervisorDriver) -> tuple[int, str]:
    try:
        current = hv.get_guest(message.vm_id)
    except GuestNotFound:
        return (held.generation if held else message.generation), ABSENT
    return current.generation, current.power.value


def apply(
    message: VmApply, hv: HypervisorDriver, store: AppliedStore | None = None
) -> tuple[int, str]:
    """Converge one guest to ``message``; returns the (generation, power) it ends at.

    A message older than what this host last applied or removed for the guest changes
    nothing (a redelivered ``vm_apply`` never brings a deleted guest back), nor does one
    past its ``expires_at``; either way the answer is what the host holds."""
    store = store or applied_store()
    held = store.get(message.vm_id)
    if _superseded(message, held):
        log.warning(
            "vm %s: generation %d %s ignored, generation %d %s already applied here",
            message.vm_id,
            message.generation,
            message.desired,
            held.generation,
            "removed" if held.absent else "applied",
        )
        return _as_held(message, held, hv)
    if message.desired != ABSENT and message.expires_at and time.time() > message.expires_at:
        log.warning(
            "vm %s: generation %d expired before it was applied; ignored",
            message.vm_id,
            message.generation,
        )
        return _as_held(message, held, hv)
    if message.desired == ABSENT:
        keep = message.extra.get("keep_root_disk")
        if keep:  # shelve: stop gracefully, keep the disk, then undefine (each idempotent)
            with contextlib.suppress(GuestNotFound):
                hv.ensure_stopped(message.vm_id, graceful_timeout_s=message.graceful_timeout_s)
            keep_root_disk(message.vm_id, keep, hv)
        hv.ensure_absent(message.vm_id)
        shutil.rmtree(instance_dir(message.vm_id), ignore_errors=True)
        remove = message.extra.get("remove_root_disk")
        if remove:
            Path(remove).unlink(missing_ok=True)
        store.record(message.vm_id, message.generation, absent=True)
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
    if current is not None and current.power is PowerState.RUNNING:
        # Before the new generation is recorded: a guest that has not released a disk
        # leaves the generation behind, so the controller's reconcile sends the work again.
        converge_volumes(spec, hv)
    state = hv.ensure_defined(spec)
    if message.desired == "running":
        if message.reboot and first_apply and state.power is PowerState.RUNNING:
            hv.ensure_stopped(message.vm_id, graceful_timeout_s=message.graceful_timeout_s)
        netns = _taps_go_to_netns(spec, hv)
        if message.reset and first_apply and state.power is PowerState.RUNNING:
            state = hv.reset(message.vm_id)  # the same QEMU: its taps stay where they are
        if netns and state.power is PowerState.RUNNING and not (message.reboot and first_apply):
            # Running: its taps already sit in the host's namespace, held by its QEMU.
            state = hv.ensure_running(message.vm_id)
        else:
            off = state.power is not PowerState.RUNNING or (message.reboot and first_apply)
            state = start_guest(spec, hv, off=off)
            if netns:
                hand_taps_to_netns(spec, netns)
    else:
        state = hv.ensure_stopped(message.vm_id, graceful_timeout_s=message.graceful_timeout_s)
    store.record(message.vm_id, state.generation, absent=False)
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


@shared_task(name=VM_CONSOLE_LOG_TASK, acks_late=True, time_limit=30, ignore_result=True)
def vm_console_log(*, vm_id: str, operation_id: str, max_bytes: int = CONSOLE_LOG_MAX_BYTES):
    """Answer a console-log request: the last ``max_bytes`` (at most 64 KiB) of the guest's
    serial console, decoded as UTF-8 (undecodable bytes replaced)."""
    host = runtime.config().host
    try:
        data = driver().console_log(vm_id, min(max_bytes, CONSOLE_LOG_MAX_BYTES))
    except DriverError as e:
        reports.operation_result(
            host, operation_id, ok=False, error_code="host_error", error_message=str(e)
        )
        return
    result = {"output": data.decode("utf-8", "replace"), "bytes": len(data)}
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
    """Send every Kumo guest this host holds; the controller reconciles against it. The
    report is stamped with the moment before libvirt was read, so it never claims to be
    newer than what it saw."""
    taken_at = reports.now()
    guests = [_guest_wire(g) for g in driver().list_guests()]
    try:
        applied_store().prune()
    except OSError as e:
        log.warning("applied-generation records not pruned: %s", e)
    reports.send(runtime.config().host, GUESTS_REPORT, {"guests": guests}, taken_at=taken_at)


_pruning = threading.Lock()


def image_cache_prune() -> None:
    """The agent's hourly prune of its image cache (``prune_image_cache``), in a thread of
    its own: the agent's reports share one timer thread with the heartbeat, and listing a
    shared shelve store may take long. A prune still running when the next falls due is
    left to finish alone."""
    if not _pruning.acquire(blocking=False):
        return

    def prune() -> None:
        try:
            prune_image_cache()
        except OSError as e:
            log.warning("image cache not pruned: %s", e)
        finally:
            _pruning.release()

    threading.Thread(target=prune, name="image-cache-prune", daemon=True).start()


def prune_image_cache() -> list[str]:
    """Remove from this host's image cache the copies that no disk here is based on and
    that no guest was made from for ``KUMO_IMAGE_CACHE_MIN_AGE_S``, then more of them, least
    recently used first, while the cache is over ``KUMO_IMAGE_CACHE_MAX_GIB``
    (``ImageCache.prune``); returns their checksums. The disks looked at: every guest's
    instance overlay, and every kept disk in the shelve store (those kept before shelve
    merged them with their image are overlays on a copy). Nothing to do on a host whose
    cache was never made (a simulated one)."""
    config = runtime.config()
    cache = ImageCache(config.image_cache_dir)
    if not cache.root.is_dir():
        return []
    disks = [*Path(config.instances_dir).glob("*/root.qcow2")]
    disks += Path(config.shelve_store).glob("*.qcow2")
    in_use = {base for disk in disks if (base := backing_file(disk)) is not None}
    removed = cache.prune(
        in_use,
        min_age_s=config.image_cache_min_age_s,
        max_bytes=int(config.image_cache_max_gib * 2**30),
    )
    if removed:
        log.info("image cache: removed %d unused copies: %s", len(removed), ", ".join(removed))
    return removed
