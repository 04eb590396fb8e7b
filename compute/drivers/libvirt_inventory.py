"""What libvirt says about the host, parsed: NUMA cells from ``getCapabilities()`` (or from
``getInfo()`` when those list none) and PCI devices from node device XML, classified as
Kumo schedules them. Pure XML and arithmetic over strings libvirt returned: this module
makes no libvirt call (``compute.drivers.libvirt`` does, and uses these)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from compute.drivers.base import DeviceKind, NumaCell, PciAddress, PciDevice

NVIDIA_VENDOR = 0x10DE
MELLANOX_VENDOR = 0x15B3
# PCI class codes without the programming interface byte (class << 8 | subclass).
_GPU_CLASSES = {0x0300, 0x0302}  # VGA compatible controller, 3D controller
_NIC_CLASSES = {0x0200, 0x0207}  # Ethernet controller, InfiniBand controller
# Mellanox ConnectX virtual-function product ids (pci.ids): ConnectX-4, -4 Lx, -5, -5 Ex,
# -6, and the "mlx5Gen" VF that ConnectX-6 Dx, -6 Lx and -7 present.
MELLANOX_VF_PRODUCTS = frozenset({0x1014, 0x1016, 0x1018, 0x101A, 0x101C, 0x101E})
# Memory units libvirt writes in capabilities (always KiB today; the rest are cheap to allow).
_BYTES_PER_UNIT = {"b": 1, "bytes": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20}
_BYTES_PER_UNIT |= {"g": 2**30, "gib": 2**30}


def _int(text: str | None) -> int:
    """A number as libvirt writes it in XML: decimal, or hex with ``0x``."""
    if text is None:
        raise ValueError("missing number")
    text = text.strip()
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _address(element: ET.Element) -> PciAddress:
    """A ``PciAddress`` from an ``<address domain= bus= slot= function=>`` element."""
    return PciAddress(*(_int(element.get(f)) for f in ("domain", "bus", "slot", "function")))


def parse_capability_cells(capabilities_xml: str) -> tuple[NumaCell, ...]:
    """The NUMA cells listed in ``getCapabilities()`` (host/topology/cells), sorted by id;
    empty when the capabilities list none."""
    caps = ET.fromstring(capabilities_xml)
    cells = []
    for cell in caps.findall("host/topology/cells/cell"):
        memory, memory_mib = cell.find("memory"), 0
        if memory is not None and memory.text:
            unit = (memory.get("unit") or "KiB").lower()
            if unit not in _BYTES_PER_UNIT:
                raise ValueError(f"unknown memory unit {unit!r}")
            memory_mib = _int(memory.text) * _BYTES_PER_UNIT[unit] // 2**20
        cpus = tuple(sorted(_int(cpu.get("id")) for cpu in cell.findall("cpus/cpu")))
        cells.append(NumaCell(id=_int(cell.get("id")), cpus=cpus, memory_mib=memory_mib))
    return tuple(sorted(cells, key=lambda cell: cell.id))


def cells_from_node_info(cpus: int, memory_mib: int, nodes: int) -> tuple[NumaCell, ...]:
    """NUMA cells derived from ``getInfo()`` alone, for hosts whose capabilities list none.

    libvirt's test driver loaded from a file (``compute/drivers/simnode.py``) reports
    ``<cells num='0'>`` but does report the number of NUMA nodes in ``getInfo()``. Host CPU ids
    ``0..cpus-1`` are split into ``nodes`` contiguous blocks of equal size (the first
    ``cpus % nodes`` blocks take one extra CPU) and memory is shared evenly (MiB rounded
    down). That is how Linux numbers CPUs on the two-socket hosts Kumo simulates; on real
    hosts the capabilities list the cells and this is not used.
    """
    nodes = max(nodes, 1)
    size, extra = divmod(cpus, nodes)
    cells, first = [], 0
    for cell in range(nodes):
        count = size + (1 if cell < extra else 0)
        cells.append(NumaCell(cell, tuple(range(first, first + count)), memory_mib // nodes))
        first += count
    return tuple(cells)


def classify_pci(*, vendor_id: int, product_id: int, class_code: int, is_vf: bool) -> DeviceKind:
    """What a PCI function is to Kumo. NVIDIA display or 3D controllers are GPUs; a Mellanox
    function is an RDMA VF when it names a physical function or has a ConnectX VF product id,
    else an RDMA PF when it is an Ethernet or InfiniBand controller; anything else is OTHER."""
    base_class = class_code >> 8
    if vendor_id == NVIDIA_VENDOR and base_class in _GPU_CLASSES:
        return DeviceKind.GPU
    if vendor_id == MELLANOX_VENDOR:
        if is_vf or product_id in MELLANOX_VF_PRODUCTS:
            return DeviceKind.RDMA_VF
        if base_class in _NIC_CLASSES:
            return DeviceKind.RDMA_PF
    return DeviceKind.OTHER


def parse_pci_device(device_xml: str) -> PciDevice:
    """A ``PciDevice`` from one node device's ``XMLDesc()`` (``ValueError`` when the XML has
    no usable PCI capability)."""
    try:
        root = ET.fromstring(device_xml)
    except ET.ParseError as exc:
        raise ValueError(f"unreadable node device XML: {exc}") from exc
    cap = root.find("capability[@type='pci']")
    if cap is None:
        raise ValueError(f"node device {root.findtext('name')!r} has no PCI capability")
    vendor, product = cap.find("vendor"), cap.find("product")
    if vendor is None or product is None:
        raise ValueError(f"node device {root.findtext('name')!r} lacks vendor or product")
    address = PciAddress(*(_int(cap.findtext(f)) for f in ("domain", "bus", "slot", "function")))
    pf = cap.find("capability[@type='phys_function']/address")
    numa, group = cap.find("numa"), cap.find("iommuGroup")
    class_code = _int(cap.findtext("class") or "0")
    vendor_id, product_id = _int(vendor.get("id")), _int(product.get("id"))
    physical_function = _address(pf) if pf is not None else None
    numa_node = _int(numa.get("node")) if numa is not None and numa.get("node") else None
    return PciDevice(
        name=root.findtext("name") or "",
        address=address,
        kind=classify_pci(
            vendor_id=vendor_id,
            product_id=product_id,
            class_code=class_code,
            is_vf=physical_function is not None,
        ),
        class_code=class_code,
        vendor_id=vendor_id,
        product_id=product_id,
        vendor_name=(vendor.text or "").strip(),
        product_name=(product.text or "").strip(),
        numa_node=numa_node if numa_node is not None and numa_node >= 0 else None,
        iommu_group=_int(group.get("number")) if group is not None else None,
        physical_function=physical_function,
    )
