"""libvirt domain XML for a ``GuestSpec``, and the Kumo metadata read back from it.

Pure functions over strings: no libvirt connection, no Django. The domain is named
``kumo-<vm_id>`` with a UUID derived from ``vm_id``, so redefining the same vm_id always
addresses the same domain. ``<metadata>`` carries a Kumo-namespaced element with the vm_id and
the generation this definition applies; that element is what marks a domain as Kumo's.
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compute.drivers.base import GuestSpec, validate_vm_id

KUMO_NS = "https://kumo.invalid/xmlns/libvirt/guest/1"
KUMO_PREFIX = "kumo"
NAME_PREFIX = "kumo-"
# Fixed namespace for uuid5: the same vm_id gives the same domain UUID on every host.
_UUID_NAMESPACE = uuid.UUID("5b0f3b7e-8d1c-4a52-9f3e-6b2d1c0a7e41")

ET.register_namespace(KUMO_PREFIX, KUMO_NS)


@dataclass(frozen=True)
class KumoMetadata:
    vm_id: str
    generation: int


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


def build_domain_xml(
    spec: GuestSpec,
    *,
    domain_type: str = "kvm",
    machine: str | None = "q35",
    cell_cpus: Sequence[int] = (),
) -> str:
    """Domain XML for ``spec``.

    ``cell_cpus`` are the host CPUs of ``spec.numa_cell`` (the caller reads them from the
    host's topology); they are required when ``numa_cell`` is set, and then every vCPU and the
    emulator threads are pinned to them and memory is bound strictly to the cell. No
    ``<graphics>`` element: headless guests simply have none (``type='none'`` is invalid).
    """
    if spec.numa_cell is not None and not cell_cpus:
        raise ValueError(f"numa_cell {spec.numa_cell} needs the cell's host CPUs")

    dom = ET.Element("domain", type=domain_type)
    ET.SubElement(dom, "name").text = domain_name(spec.vm_id)
    ET.SubElement(dom, "uuid").text = domain_uuid(spec.vm_id)
    ET.SubElement(dom, "title").text = " ".join(spec.name.split())  # one line only

    metadata = ET.SubElement(dom, "metadata")
    guest = ET.SubElement(metadata, f"{{{KUMO_NS}}}guest")
    ET.SubElement(guest, f"{{{KUMO_NS}}}vm-id").text = spec.vm_id
    ET.SubElement(guest, f"{{{KUMO_NS}}}generation").text = str(spec.generation)

    # KiB, as libvirt writes it back, so our XML and XMLDesc's compare field by field.
    ET.SubElement(dom, "memory", unit="KiB").text = str(spec.memory_mib * 1024)
    ET.SubElement(dom, "currentMemory", unit="KiB").text = str(spec.memory_mib * 1024)
    vcpu = ET.SubElement(dom, "vcpu", placement="static")
    vcpu.text = str(spec.vcpus)
    if spec.numa_cell is not None:
        cpuset = format_cpuset(cell_cpus)
        vcpu.set("cpuset", cpuset)
        cputune = ET.SubElement(dom, "cputune")
        for index in range(spec.vcpus):
            ET.SubElement(cputune, "vcpupin", vcpu=str(index), cpuset=cpuset)
        ET.SubElement(cputune, "emulatorpin", cpuset=cpuset)
        numatune = ET.SubElement(dom, "numatune")
        ET.SubElement(numatune, "memory", mode="strict", nodeset=str(spec.numa_cell))

    os_el = ET.SubElement(dom, "os")
    os_type = ET.SubElement(os_el, "type")
    os_type.text = "hvm"
    if machine:
        os_type.set("machine", machine)
    ET.SubElement(os_el, "boot", dev="hd")
    features = ET.SubElement(dom, "features")
    ET.SubElement(features, "acpi")  # graceful shutdown needs ACPI
    ET.SubElement(features, "apic")
    ET.SubElement(dom, "cpu", mode="host-passthrough")
    ET.SubElement(dom, "on_poweroff").text = "destroy"
    ET.SubElement(dom, "on_reboot").text = "restart"
    ET.SubElement(dom, "on_crash").text = "destroy"

    devices = ET.SubElement(dom, "devices")
    for disk in spec.disks:
        disk_el = ET.SubElement(devices, "disk", type="file", device="disk")
        ET.SubElement(disk_el, "driver", name="qemu", type=disk.format, cache="none")
        ET.SubElement(disk_el, "source", file=disk.source)
        ET.SubElement(disk_el, "target", dev=disk.target_dev, bus="virtio")
        if disk.read_only:
            ET.SubElement(disk_el, "readonly")
    for gpu in spec.gpus:
        hostdev = ET.SubElement(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
        source = ET.SubElement(hostdev, "source")
        ET.SubElement(
            source,
            "address",
            domain=_hex(gpu.domain, 4),
            bus=_hex(gpu.bus, 2),
            slot=_hex(gpu.slot, 2),
            function=_hex(gpu.function, 1),
        )
    ET.SubElement(devices, "console", type="pty")
    return ET.tostring(dom, encoding="unicode")


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
    return KumoMetadata(vm_id=vm_id.strip(), generation=int(generation))


def parse_hostdev_addresses(xml: str) -> list[str]:
    """PCI source addresses of the domain's ``<hostdev type='pci'>`` devices, formatted like
    ``0000:3b:00.0`` (for checks and resync)."""
    root = ET.fromstring(xml)
    found = []
    for address in root.iterfind("devices/hostdev[@type='pci']/source/address"):
        parts = [int(address.get(key, "0"), 16) for key in ("domain", "bus", "slot", "function")]
        found.append(f"{parts[0]:04x}:{parts[1]:02x}:{parts[2]:02x}.{parts[3]:x}")
    return found
