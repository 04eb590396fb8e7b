"""NCCL topology for GPU passthrough guests.

Inside a VM, NCCL sees every passed-through GPU and RDMA NIC hanging straight off a root
bus: it cannot tell which GPU shares a host NUMA cell and PCIe fabric with which NIC, so it
ranks GPU-to-NIC paths as ``PHB``/``SYS``, switches GPUDirect RDMA off and picks poor rings.
The fix NCCL offers is ``NCCL_TOPO_FILE``: an XML description of the system that replaces
what it would detect. This module writes one per guest from the same pure layout the domain
XML is built from (``domain_xml.guest_numa_layout`` and ``guest_pci_layout``), so every
``busid`` in it is the address the guest really sees:

- one ``<cpu numaid=…>`` per guest NUMA cell, with the cell's vCPUs as its ``affinity`` mask;
- below it one virtual PCIe switch (``busid ffff:ff:<cell>.0``, class ``0x060400``, the
  convention NCCL and the public clouds' published topology files use for a switch that
  has no guest address), holding every GPU (``0x030200``) and RDMA NIC (``0x020700``) of
  that cell at its guest address, so GPUs and NICs on one host cell are ``PXB`` to each
  other and GPUDirect RDMA stays on between them.

What NCCL fills in itself inside the guest: the GPUs' NVLink/NVSwitch links (from NVML) and
the NICs' ports and speeds (from the verbs library). The host inventory carries no PCIe
switch hierarchy, so all devices of one host cell share one virtual switch; the NUMA
locality, the part passthrough loses, is exact.

``guest_files`` returns what cloud-init writes into the guest (``compute.drivers.cloudinit``):
the topology, and ``/etc/nccl.conf`` naming it (NCCL reads that file for its settings; a
user's own ``NCCL_TOPO_FILE`` in the environment still wins).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from compute.drivers.base import DeviceKind, GuestSpec
from compute.drivers.domain_xml import guest_numa_layout, guest_pci_layout

TOPOLOGY_PATH = "/etc/nccl/kumo-topo.xml"
CONF_PATH = "/etc/nccl.conf"

SWITCH_CLASS = 0x060400
GPU_CLASS = 0x030200  # 3D controller, what an A100 reports
NIC_CLASS = 0x020700  # InfiniBand/RoCE controller, what a ConnectX function reports
# PCIe 4.0 x16 (A100, ConnectX-6), in the form NCCL's xml parser reads.
LINK_SPEED = "16 GT/s"
LINK_WIDTH = "16"

_CLASS_OF = {DeviceKind.GPU: GPU_CLASS, DeviceKind.RDMA_VF: NIC_CLASS}


def cpu_affinity(cpus: Iterable[int]) -> str:
    """A cpumask as Linux prints it (``/sys/devices/system/node/node0/cpumap``) and NCCL
    parses it: 32-bit hex words, most significant first, comma-separated."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    words = max(1, (mask.bit_length() + 31) // 32)
    return ",".join(f"{(mask >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


def topology_xml(spec: GuestSpec) -> str | None:
    """The NCCL topology of ``spec``'s guest, or ``None`` when it has no GPU."""
    if not spec.gpus:
        return None
    cells = guest_numa_layout(spec)
    slots = guest_pci_layout(spec)
    system = ET.Element("system", version="1")
    for cell in cells:
        cpu = ET.SubElement(
            system,
            "cpu",
            numaid=str(cell.id),
            affinity=cpu_affinity(cell.vcpus),
            arch="x86_64",
        )
        switch = ET.SubElement(
            cpu,
            "pci",
            busid=f"ffff:ff:{cell.id:02x}.0",
            **{"class": f"0x{SWITCH_CLASS:06x}"},
            link_speed=LINK_SPEED,
            link_width=LINK_WIDTH,
        )
        for slot in slots:
            if slot.guest_cell != cell.id or slot.kind not in _CLASS_OF:
                continue
            ET.SubElement(
                switch,
                "pci",
                busid=str(slot.guest_address),
                **{"class": f"0x{_CLASS_OF[slot.kind]:06x}"},
                vendor=f"0x{slot.vendor_id:04x}",
                device=f"0x{slot.product_id:04x}",
                link_speed=LINK_SPEED,
                link_width=LINK_WIDTH,
            )
    ET.indent(system)
    return ET.tostring(system, encoding="unicode") + "\n"


def guest_files(spec: GuestSpec) -> dict[str, str]:
    """Files for cloud-init to write into a GPU guest (none for a guest without GPUs)."""
    topology = topology_xml(spec)
    if topology is None:
        return {}
    return {TOPOLOGY_PATH: topology, CONF_PATH: f"NCCL_TOPO_FILE={TOPOLOGY_PATH}\n"}
