"""libvirt domain XML for a ``GuestSpec``, and the Kumo metadata read back from it.

Pure functions over strings and frozen dataclasses: no libvirt connection, no Django. The
domain is named ``kumo-<vm_id>`` with a UUID derived from ``vm_id``, so redefining the same
vm_id always addresses the same domain. ``<metadata>`` carries a Kumo-namespaced element with
the vm_id and the generation this definition applies; that element is what marks a domain as
Kumo's.

Guest topology
--------------

``guest_numa_layout(spec)`` decides the guest's NUMA cells, ``guest_pci_layout(spec)`` the
guest PCI address of every passthrough device. Both are pure functions of the spec: the domain
XML is built from them, and so is the NCCL topology the guest reads (``compute.drivers.nccl``),
so the two always agree and the topology can name devices before the guest boots.

* A guest without passthrough devices has no guest NUMA topology. With ``numa_cell`` set its
  vCPUs and emulator threads are pinned to that host cell and its memory is bound strictly to
  it; without, it floats.
* A guest with devices gets one guest NUMA cell per host cell it uses: ``numa_cell`` when set
  (every device then sits on guest cell 0), else one per host cell its devices hang off (a
  whole-node guest with 8 GPUs on two cells gets two). vCPUs and memory are split evenly
  (remainders to the lowest cells); each guest cell's vCPUs are pinned to its host cell's
  CPUs and its memory bound to that cell (``<memnode>``). A device whose host cell is unknown
  goes to guest cell 0; if no device's cell is known the single guest cell is not pinned.
* On q35, each guest cell gets a ``pcie-expander-bus`` (QEMU's ``pxb-pcie``) whose
  ``<node>`` is that guest cell, so the guest kernel reports every device below it on the
  right NUMA node. Guest cell ``i``'s expander has bus number ``0x80 + 0x10 * i``; device
  ``j`` of the cell (devices ordered by host address) sits alone behind ``pcie-root-port``
  ``j`` in slot ``j`` of the expander, so its guest address is ``0000:(busNr+1+j):00.0``.
  That is the number the guest firmware gives it: SeaBIOS and OVMF both number the buses
  below a root bus depth-first in slot order starting at the root bus number + 1, and Linux
  keeps the firmware's numbering. At most 8 guest cells and 15 devices per cell (the next
  expander's bus number caps the range); the buses below 0x80 are the main root bus's.
* The guest PCI address is guest-visible ABI: changing the constants above changes every
  guest's device addresses at its next definition.
* Each tap NIC (``GuestNic`` of kind ``TAP``, in the order given) is a virtio NIC alone
  behind its own ``pcie-root-port``, whose controller indexes follow every controller
  above, so adding or removing NICs never moves a passthrough device. The NICs' root ports
  carry no address: libvirt puts them on the main root bus (``pcie-root``), whose buses the
  firmware numbers below 0x80, apart from the expanders' and clear of every slot libvirt
  reserves. Their guest bus numbers are left to the firmware; the guest finds its NICs by
  MAC, not by address (``compute.drivers.cloudinit``). A VF NIC is one of the passthrough
  devices and has no ``<interface>``.

What libvirt's test driver (``test:///default``, libvirt 9.0) accepts, checked by the
contract suite: ``pcie-root``, ``pcie-expander-bus`` with ``<target busNr><node>``,
``pcie-root-port`` with an explicit address on the expander, ``<hostdev>`` with an explicit
guest ``<address type='pci'>``, ``<cpu><numa>``, ``<numatune><memnode>``,
``<os><kernel>``, a virtio-scsi controller with a CD-ROM, and
``<interface type='ethernet'>`` with ``<target managed='no'>``,
``<mtu>`` and an explicit guest ``<address type='pci'>`` behind an unaddressed root port.
It does not check that an expander's ``<node>`` names a guest NUMA cell (QEMU's driver
refuses one that does not, so every expander here names one), and it never assigns
addresses itself (nothing it returns shows a guest bus number). Hence the layout is
computed here, not read back from libvirt.
"""

from __future__ import annotations

import string
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from compute.drivers.base import (
    DeviceKind,
    DiskSpec,
    GuestNic,
    GuestSpec,
    NicKind,
    NumaCell,
    PassthroughDevice,
    PciAddress,
    validate_vm_id,
)

KUMO_NS = "https://kumo.invalid/xmlns/libvirt/guest/1"
KUMO_PREFIX = "kumo"
NAME_PREFIX = "kumo-"
# Fixed namespace for uuid5: the same vm_id gives the same domain UUID on every host.
_UUID_NAMESPACE = uuid.UUID("5b0f3b7e-8d1c-4a52-9f3e-6b2d1c0a7e41")

# Guest PCI plan (guest-visible ABI, see the module docstring).
EXPANDER_FIRST_BUS = 0x80
EXPANDER_BUS_STRIDE = 0x10
MAX_GUEST_CELLS = 8
MAX_DEVICES_PER_CELL = EXPANDER_BUS_STRIDE - 1

ET.register_namespace(KUMO_PREFIX, KUMO_NS)


@dataclass(frozen=True)
class KumoMetadata:
    vm_id: str
    generation: int
    host: str = ""  # the agent (Kumo host) that defined it; "" in older definitions


@dataclass(frozen=True)
class GuestCell:
    """One guest NUMA cell: the host cell it mirrors (``None``: not pinned), its guest vCPU
    ids and its memory."""

    id: int
    host_cell: int | None
    vcpus: tuple[int, ...]
    memory_mib: int


@dataclass(frozen=True)
class GuestPciSlot:
    """Where one passthrough device appears in the guest.

    ``guest_address`` is what the guest OS sees (``lspci``, sysfs, NCCL's ``busid``);
    ``expander_index`` and ``port_index`` are the libvirt controller indexes of its
    ``pcie-expander-bus`` and ``pcie-root-port`` (``port_slot`` is the root port's slot on the
    expander). ``guest_cell`` is the guest NUMA cell the expander reports.
    """

    host_address: PciAddress
    guest_address: PciAddress
    kind: DeviceKind
    guest_cell: int
    class_code: int
    vendor_id: int
    product_id: int
    expander_index: int
    port_index: int
    port_slot: int


def domain_name(vm_id: str) -> str:
    return NAME_PREFIX + validate_vm_id(vm_id)


def domain_uuid(vm_id: str) -> str:
    return str(uuid.uuid5(_UUID_NAMESPACE, validate_vm_id(vm_id)))


def format_cpuset(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (libvirt's cpuset syntax)."""
    ordered = sorted(set(cpus))
    if not ordered:
        raise ValueError("empty cpuset")
    parts: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


def _hex(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal shares, the remainder to the first ones."""
    share, extra = divmod(total, parts)
    return [share + (1 if index < extra else 0) for index in range(parts)]


def _host_cells_used(spec: GuestSpec) -> list[int | None]:
    """Host cells mirrored by the guest's cells, in guest cell order ([] = no guest NUMA)."""
    if not spec.devices:
        return []
    if spec.numa_cell is not None:
        return [spec.numa_cell]
    known = sorted({d.numa_node for d in spec.devices if d.numa_node is not None})
    return list(known) or [None]


def guest_numa_layout(spec: GuestSpec) -> tuple[GuestCell, ...]:
    """The guest's NUMA cells (empty when it has none); see the module docstring."""
    host_cells = _host_cells_used(spec)
    if not host_cells:
        return ()
    if len(host_cells) > MAX_GUEST_CELLS:
        raise ValueError(f"devices span {len(host_cells)} host cells; at most {MAX_GUEST_CELLS}")
    if spec.vcpus < len(host_cells) or spec.memory_mib < len(host_cells):
        raise ValueError(
            f"a guest across {len(host_cells)} host cells needs at least one vCPU and one MiB"
            " per cell"
        )
    cells = []
    first_vcpu = 0
    shares = zip(
        _split(spec.vcpus, len(host_cells)), _split(spec.memory_mib, len(host_cells)), strict=True
    )
    for index, (host_cell, (vcpus, memory_mib)) in enumerate(zip(host_cells, shares, strict=True)):
        vcpu_ids = tuple(range(first_vcpu, first_vcpu + vcpus))
        cells.append(GuestCell(index, host_cell, vcpu_ids, memory_mib))
        first_vcpu += vcpus
    return tuple(cells)


def _guest_cell_of(device: PassthroughDevice, cells: Sequence[GuestCell]) -> int:
    if len(cells) == 1:
        return 0
    for cell in cells:
        if cell.host_cell == device.numa_node:
            return cell.id
    return 0  # host cell unknown


def guest_pci_layout(spec: GuestSpec) -> tuple[GuestPciSlot, ...]:
    """Where each of ``spec.devices`` appears in a q35 guest, ordered by guest address.

    Pure and deterministic: the same spec always gives the same layout, whichever host or
    process computes it. Raises ``ValueError`` past 15 devices on one guest cell.
    """
    cells = guest_numa_layout(spec)
    by_cell: dict[int, list[PassthroughDevice]] = {cell.id: [] for cell in cells}
    for device in spec.devices:
        by_cell[_guest_cell_of(device, cells)].append(device)
    slots = []
    port_index = 1 + len(cells)  # pcie-root is 0, the expanders 1..len(cells)
    for cell in cells:
        devices = sorted(by_cell[cell.id], key=lambda device: device.address)
        if len(devices) > MAX_DEVICES_PER_CELL:
            raise ValueError(
                f"{len(devices)} devices on guest cell {cell.id}; at most {MAX_DEVICES_PER_CELL}"
            )
        bus_nr = EXPANDER_FIRST_BUS + EXPANDER_BUS_STRIDE * cell.id
        for slot, device in enumerate(devices):
            slots.append(
                GuestPciSlot(
                    host_address=device.address,
                    guest_address=PciAddress(0, bus_nr + 1 + slot, 0, 0),
                    kind=device.kind,
                    guest_cell=cell.id,
                    class_code=device.class_code,
                    vendor_id=device.vendor_id,
                    product_id=device.product_id,
                    expander_index=1 + cell.id,
                    port_index=port_index,
                    port_slot=slot,
                )
            )
            port_index += 1
    return tuple(slots)


def _cell_cpus(cells: Sequence[NumaCell] | Mapping[int, Sequence[int]]) -> dict[int, tuple]:
    if isinstance(cells, Mapping):
        return {cell: tuple(cpus) for cell, cpus in cells.items()}
    return {cell.id: tuple(cell.cpus) for cell in cells}


def _is_q35(machine: str | None) -> bool:
    return bool(machine) and (machine == "q35" or "q35" in machine.split("-"))


def _pci_address(parent: ET.Element, *, bus: int, slot: int) -> None:
    ET.SubElement(
        parent,
        "address",
        type="pci",
        domain=_hex(0, 4),
        bus=_hex(bus, 2),
        slot=_hex(slot, 2),
        function=_hex(0, 1),
    )


def _cdrom_target(spec: GuestSpec) -> str:
    taken = {disk.target_dev for disk in spec.disks}
    return next(f"sd{letter}" for letter in string.ascii_lowercase if f"sd{letter}" not in taken)


HOTPLUG_PORTS = 8  # free PCIe root ports a real guest keeps for volumes attached live


def disk_element(disk: DiskSpec) -> ET.Element:
    """One virtio ``<disk>``: a file, or volume ``source`` of libvirt pool ``pool``; with
    ``<serial>``, the guest sees it as ``/dev/disk/by-id/virtio-<serial>``."""
    disk_el = ET.Element("disk", type="volume" if disk.pool else "file", device="disk")
    ET.SubElement(disk_el, "driver", name="qemu", type=disk.format, cache="none")
    if disk.pool:
        ET.SubElement(disk_el, "source", pool=disk.pool, volume=disk.source)
    else:
        ET.SubElement(disk_el, "source", file=disk.source)
    ET.SubElement(disk_el, "target", dev=disk.target_dev, bus="virtio")
    if disk.serial:
        ET.SubElement(disk_el, "serial").text = disk.serial
    if disk.read_only:
        ET.SubElement(disk_el, "readonly")
    return disk_el


def volume_disks(xml: str) -> dict[str, tuple[str, str, str]]:
    """The pool-backed disks (Kumo's volumes) of a domain XML: target dev -> (pool, volume,
    serial)."""
    found = {}
    for disk in ET.fromstring(xml).iterfind("devices/disk"):
        source, target = disk.find("source"), disk.find("target")
        if disk.get("type") != "volume" or source is None or target is None:
            continue
        found[target.get("dev")] = (
            source.get("pool", ""),
            source.get("volume", ""),
            disk.findtext("serial") or "",
        )
    return found


def build_domain_xml(
    spec: GuestSpec,
    *,
    cells: Sequence[NumaCell] | Mapping[int, Sequence[int]] = (),
    domain_type: str = "kvm",
    machine: str | None = "q35",
    cpu_mode: str = "host-passthrough",
    cpu_disable: Sequence[str] = (),
    host: str = "",
) -> str:
    """Domain XML for ``spec``.

    ``cells`` are the host's NUMA cells with their CPU ids (``NumaCell``s, or a mapping of
    cell id to CPU ids), as ``HypervisorDriver.host_cells()`` returns them; every host cell
    the guest is pinned to must be among them (``ValueError`` otherwise). Passthrough devices
    and tap NICs need a q35 machine (their guest addresses are planned on its PCIe
    topology).
    ``cpu_mode`` is libvirt's ``<cpu mode>`` (default ``host-passthrough``: GPU and HPC work
    wants every host CPU feature); ``cpu_disable`` names CPU features to hide from the guest,
    for a host that is itself a VM whose hypervisor refuses some of them (nested KVM refuses
    ``arch-capabilities``' MSR on some machines); an empty ``cpu_mode`` leaves QEMU's
    default CPU model (what TCG guests, ``domain_type`` ``qemu``, get). No
    ``<graphics>``: headless guests have none (``type='none'`` is invalid); the serial port
    is the console. A direct kernel boot has no ``<boot>`` element. ``host`` names the
    Kumo host whose agent defines it, in the metadata, so agents sharing one libvirt (test
    fleets, a bench) each see only their own guests.
    """
    host_cpus = _cell_cpus(cells)
    guest_cells = guest_numa_layout(spec)
    slots = guest_pci_layout(spec)
    taps = [nic for nic in spec.nics if nic.kind is NicKind.TAP]
    if (slots or taps) and not _is_q35(machine):
        raise ValueError(f"passthrough devices and NICs need a q35 machine, not {machine!r}")
    pinned_cells = [spec.numa_cell] if spec.numa_cell is not None else []
    pinned_cells += [c.host_cell for c in guest_cells if c.host_cell is not None]
    for host_cell in pinned_cells:
        if not host_cpus.get(host_cell):
            raise ValueError(f"host has no NUMA cell {host_cell}")

    dom = ET.Element("domain", type=domain_type)
    ET.SubElement(dom, "name").text = domain_name(spec.vm_id)
    ET.SubElement(dom, "uuid").text = domain_uuid(spec.vm_id)
    ET.SubElement(dom, "title").text = " ".join(spec.name.split())  # one line only

    metadata = ET.SubElement(dom, "metadata")
    guest = ET.SubElement(metadata, f"{{{KUMO_NS}}}guest")
    ET.SubElement(guest, f"{{{KUMO_NS}}}vm-id").text = spec.vm_id
    ET.SubElement(guest, f"{{{KUMO_NS}}}generation").text = str(spec.generation)
    if host:
        ET.SubElement(guest, f"{{{KUMO_NS}}}host").text = host

    # KiB, as libvirt writes it back, so our XML and XMLDesc's compare field by field.
    ET.SubElement(dom, "memory", unit="KiB").text = str(spec.memory_mib * 1024)
    ET.SubElement(dom, "currentMemory", unit="KiB").text = str(spec.memory_mib * 1024)
    vcpu = ET.SubElement(dom, "vcpu", placement="static")
    vcpu.text = str(spec.vcpus)
    _pinning(dom, vcpu, spec, guest_cells, host_cpus)

    os_el = ET.SubElement(dom, "os")
    os_type = ET.SubElement(os_el, "type")
    os_type.text = "hvm"
    if machine:
        os_type.set("machine", machine)
    if spec.kernel:
        ET.SubElement(os_el, "kernel").text = spec.kernel
        if spec.initrd:
            ET.SubElement(os_el, "initrd").text = spec.initrd
        if spec.cmdline:
            ET.SubElement(os_el, "cmdline").text = spec.cmdline
    else:
        ET.SubElement(os_el, "boot", dev="hd")
    features = ET.SubElement(dom, "features")
    ET.SubElement(features, "acpi")  # graceful shutdown needs ACPI
    ET.SubElement(features, "apic")
    cpu = None
    if cpu_mode:
        cpu = ET.SubElement(dom, "cpu", mode=cpu_mode)
        for feature in cpu_disable:
            ET.SubElement(cpu, "feature", policy="disable", name=feature)
    if guest_cells:
        if cpu is None:  # an emulated CPU (TCG): QEMU's default model
            cpu = ET.SubElement(dom, "cpu")
        numa = ET.SubElement(cpu, "numa")
        for cell in guest_cells:
            ET.SubElement(
                numa,
                "cell",
                id=str(cell.id),
                cpus=format_cpuset(cell.vcpus),
                memory=str(cell.memory_mib * 1024),
                unit="KiB",
            )
    ET.SubElement(dom, "on_poweroff").text = "destroy"
    ET.SubElement(dom, "on_reboot").text = "restart"
    ET.SubElement(dom, "on_crash").text = "destroy"

    devices = ET.SubElement(dom, "devices")
    for disk in spec.disks:
        devices.append(disk_element(disk))
    if spec.seed_iso:
        # The seed CD-ROM on virtio-scsi, not SATA: Debian's cloud kernels (and so its
        # genericcloud images and Kumo's own) have no AHCI driver and would never see it.
        ET.SubElement(devices, "controller", type="scsi", index="0", model="virtio-scsi")
        cdrom = ET.SubElement(devices, "disk", type="file", device="cdrom")
        ET.SubElement(cdrom, "driver", name="qemu", type="raw")
        ET.SubElement(cdrom, "source", file=spec.seed_iso)
        ET.SubElement(cdrom, "target", dev=_cdrom_target(spec), bus="scsi")
        ET.SubElement(cdrom, "readonly")
    hotplug = HOTPLUG_PORTS if _is_q35(machine) and domain_type != "test" else 0
    if slots or taps or hotplug:
        ET.SubElement(devices, "controller", type="pci", index="0", model="pcie-root")
    if slots:
        _pci_topology(devices, guest_cells, slots)
    first_port_index = 1 + len(guest_cells) + len(slots)
    _interfaces(devices, taps, first_port_index=first_port_index)
    # Empty root ports for volumes attached to the running guest (a q35 machine hot-plugs
    # only into a free pcie-root-port); libvirt's test driver plugs nothing, so a
    # simulated guest has none.
    for index in range(hotplug):
        ET.SubElement(
            devices,
            "controller",
            type="pci",
            index=str(first_port_index + len(taps) + index),
            model="pcie-root-port",
        )
    serial = ET.SubElement(devices, "serial", type="pty")
    if spec.console_log:
        ET.SubElement(serial, "log", file=spec.console_log, append="on")
    ET.SubElement(serial, "target", port="0")
    console = ET.SubElement(devices, "console", type="pty")
    ET.SubElement(console, "target", type="serial", port="0")
    return ET.tostring(dom, encoding="unicode")


def _pinning(
    dom: ET.Element,
    vcpu: ET.Element,
    spec: GuestSpec,
    guest_cells: Sequence[GuestCell],
    host_cpus: Mapping[int, Sequence[int]],
) -> None:
    """``<cputune>`` and ``<numatune>``: each vCPU on its cell's host CPUs, the emulator on
    all of them, memory strictly on the host cells used."""
    if guest_cells and all(cell.host_cell is not None for cell in guest_cells):
        vcpu_host_cells = {v: cell.host_cell for cell in guest_cells for v in cell.vcpus}
        memnodes = [(cell.id, cell.host_cell) for cell in guest_cells]
    elif spec.numa_cell is not None:
        vcpu_host_cells = dict.fromkeys(range(spec.vcpus), spec.numa_cell)
        memnodes = [(cell.id, spec.numa_cell) for cell in guest_cells]
    else:
        return
    used = sorted(set(vcpu_host_cells.values()))
    all_cpus = format_cpuset(cpu for cell in used for cpu in host_cpus[cell])
    vcpu.set("cpuset", all_cpus)
    cputune = ET.SubElement(dom, "cputune")
    for index in range(spec.vcpus):
        cpuset = format_cpuset(host_cpus[vcpu_host_cells[index]])
        ET.SubElement(cputune, "vcpupin", vcpu=str(index), cpuset=cpuset)
    ET.SubElement(cputune, "emulatorpin", cpuset=all_cpus)
    numatune = ET.SubElement(dom, "numatune")
    ET.SubElement(numatune, "memory", mode="strict", nodeset=format_cpuset(used))
    for guest_cell, host_cell in memnodes:
        ET.SubElement(
            numatune, "memnode", cellid=str(guest_cell), mode="strict", nodeset=str(host_cell)
        )


def _pci_topology(
    devices: ET.Element, guest_cells: Sequence[GuestCell], slots: Sequence[GuestPciSlot]
) -> None:
    """The expanders, root ports and ``<hostdev>``s of ``guest_pci_layout``."""
    for cell in guest_cells:
        expander = ET.SubElement(
            devices, "controller", type="pci", index=str(1 + cell.id), model="pcie-expander-bus"
        )
        target = ET.SubElement(
            expander, "target", busNr=str(EXPANDER_FIRST_BUS + EXPANDER_BUS_STRIDE * cell.id)
        )
        ET.SubElement(target, "node").text = str(cell.id)
    for slot in slots:
        port = ET.SubElement(
            devices, "controller", type="pci", index=str(slot.port_index), model="pcie-root-port"
        )
        _pci_address(port, bus=slot.expander_index, slot=slot.port_slot)
    for slot in slots:
        hostdev = ET.SubElement(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
        source = ET.SubElement(hostdev, "source")
        host = slot.host_address
        ET.SubElement(
            source,
            "address",
            domain=_hex(host.domain, 4),
            bus=_hex(host.bus, 2),
            slot=_hex(host.slot, 2),
            function=_hex(host.function, 1),
        )
        _pci_address(hostdev, bus=slot.port_index, slot=0)


def _interfaces(devices: ET.Element, taps: Sequence[GuestNic], *, first_port_index: int) -> None:
    """One unaddressed ``pcie-root-port`` per tap NIC, indexes from ``first_port_index`` in
    the order given, and the NIC's ``<interface type='ethernet'>`` alone behind it."""
    ports = range(first_port_index, first_port_index + len(taps))
    for index in ports:
        ET.SubElement(devices, "controller", type="pci", index=str(index), model="pcie-root-port")
    for index, nic in zip(ports, taps, strict=True):
        interface = ET.SubElement(devices, "interface", type="ethernet")
        ET.SubElement(interface, "mac", address=nic.mac)
        ET.SubElement(interface, "target", dev=nic.device, managed="no")
        ET.SubElement(interface, "model", type="virtio")
        ET.SubElement(interface, "mtu", size=str(nic.mtu))
        _pci_address(interface, bus=index, slot=0)


def parse_kumo_metadata(xml: str) -> KumoMetadata | None:
    """The vm_id and generation recorded in domain XML, or ``None`` when the domain carries
    no (or malformed) Kumo metadata, i.e. is not Kumo's."""
    root = ET.fromstring(xml)
    guest = root.find(f"metadata/{{{KUMO_NS}}}guest")
    if guest is None:
        return None
    vm_id = guest.findtext(f"{{{KUMO_NS}}}vm-id")
    generation = guest.findtext(f"{{{KUMO_NS}}}generation")
    if not vm_id or not generation or not generation.strip().isdigit():
        return None
    host = (guest.findtext(f"{{{KUMO_NS}}}host") or "").strip()
    return KumoMetadata(vm_id=vm_id.strip(), generation=int(generation), host=host)


def console_log_path(xml: str) -> str:
    """The file the domain's first serial port logs to ("" when none)."""
    log_el = ET.fromstring(xml).find("./devices/serial/log")
    return log_el.get("file", "") if log_el is not None else ""


def parse_hostdev_addresses(xml: str) -> list[str]:
    """PCI source (host) addresses of the domain's ``<hostdev type='pci'>`` devices, formatted
    like ``0000:3b:00.0``, in document order (for checks and resync)."""
    root = ET.fromstring(xml)
    found = []
    for address in root.iterfind("devices/hostdev[@type='pci']/source/address"):
        parts = [int(address.get(key, "0"), 16) for key in ("domain", "bus", "slot", "function")]
        found.append(str(PciAddress(*parts)))
    return found
