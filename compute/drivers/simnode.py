"""Simulated mdx-style hosts for libvirt's test driver.

``node_xml(kind, name)`` returns a complete test-driver node description (``<node>`` root) that
``libvirt.open("test:///abs/path/node.xml")`` loads; ``write_fleet`` writes one such file per
host. No Django here: the host agent and its tests use this module directly.

What libvirt's test driver does with the description (checked against libvirt 9.0, the
version these machines run; see tests/compute/test_simnode.py):

* ``<cpu>`` and ``<memory>`` feed ``getInfo()``. The CPU count is
  ``nodes * sockets * cores * threads``: in ``virNodeInfo`` ``sockets`` means sockets per NUMA
  node, so a 2-socket, 2-cell host is written as ``nodes=2, sockets=1``.
* Node devices (``<device>``) keep their PCI address, vendor and product ids, class,
  ``<iommuGroup>`` and ``<numa node=...>`` in ``XMLDesc()``.
* There is no way to describe NUMA cells: a file-loaded test connection builds its
  capabilities before reading the file and has no cells, so ``getCapabilities()`` shows
  ``<cells num='0'>`` and ``getCellsFreeMemory()`` fails ("Range exceeds
  available cells"). Per-cell placement of GPUs is only visible through each device's
  ``<numa node>``. The capabilities' host arch is always i686 and
  ``<iommu support='no'>``, whatever the file says; ``getFreeMemory()`` is 0.
* A ``<driver>`` element on a device is dropped, so there is none here; the ``computer``
  device must carry a system ``<uuid>`` or the connection fails to open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from uuid import NAMESPACE_DNS, uuid5
from xml.sax.saxutils import escape

Kind = Literal["gpu", "cpu"]

NVIDIA_VENDOR = 0x10DE
A100_SXM4_40GB = 0x20B0
MELLANOX_VENDOR = 0x15B3
CONNECTX6 = 0x101B

# PCI bus of each A100 on a DGX A100-like board (GPUs 0-3 on NUMA node 0, 4-7 on node 1),
# and of one ConnectX-6 per NUMA node.
GPU_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
NIC_BUSES = (0x0C, 0x8D)

KIB_PER_GIB = 1024 * 1024


@dataclass(frozen=True)
class NodeShape:
    numa_nodes: int
    sockets_per_node: int
    cores_per_socket: int
    threads_per_core: int
    memory_gib: int
    mhz: int = 2400
    model: str = "x86_64"

    @property
    def cpus(self) -> int:
        return (
            self.numa_nodes * self.sockets_per_node * self.cores_per_socket * self.threads_per_core
        )


SHAPES: dict[str, NodeShape] = {
    # 2 sockets x 32 cores x 2 threads = 128 vCPUs, one socket per NUMA cell.
    "gpu": NodeShape(
        numa_nodes=2, sockets_per_node=1, cores_per_socket=32, threads_per_core=2, memory_gib=460
    ),
    # 2 sockets x 38 cores x 2 threads = 152 vCPUs.
    "cpu": NodeShape(
        numa_nodes=2, sockets_per_node=1, cores_per_socket=38, threads_per_core=2, memory_gib=256
    ),
}


def pci_device_name(domain: int, bus: int, slot: int, function: int) -> str:
    """The node-device name libvirt gives a PCI device, e.g. ``pci_0000_07_00_0``."""
    return f"pci_{domain:04x}_{bus:02x}_{slot:02x}_{function:x}"


def _pci_device(
    *,
    bus: int,
    pci_class: int,
    vendor: int,
    vendor_name: str,
    product: int,
    product_name: str,
    iommu_group: int,
    numa_node: int,
) -> str:
    name = pci_device_name(0, bus, 0, 0)
    return f"""  <device>
    <name>{name}</name>
    <parent>computer</parent>
    <capability type='pci'>
      <class>0x{pci_class:06x}</class>
      <domain>0</domain>
      <bus>{bus}</bus>
      <slot>0</slot>
      <function>0</function>
      <product id='0x{product:04x}'>{escape(product_name)}</product>
      <vendor id='0x{vendor:04x}'>{escape(vendor_name)}</vendor>
      <iommuGroup number='{iommu_group}'>
        <address domain='0x0000' bus='0x{bus:02x}' slot='0x00' function='0x0'/>
      </iommuGroup>
      <numa node='{numa_node}'/>
    </capability>
  </device>
"""


def host_uuid(name: str) -> str:
    """A stable system UUID per host name (libvirt refuses a ``computer`` without one)."""
    return str(uuid5(NAMESPACE_DNS, f"{name}.sim.kumo"))


def _computer(name: str) -> str:
    return f"""  <device>
    <name>computer</name>
    <capability type='system'>
      <product>{escape(name)}</product>
      <hardware>
        <vendor>Kumo simulated host</vendor>
        <version>{escape(name)}</version>
        <uuid>{host_uuid(name)}</uuid>
      </hardware>
      <firmware>
        <vendor>Kumo</vendor>
      </firmware>
    </capability>
  </device>
"""


def node_xml(kind: Kind, name: str) -> str:
    """A libvirt test-driver node description for one ``kind`` ("gpu" or "cpu") host."""
    try:
        shape = SHAPES[kind]
    except KeyError:
        raise ValueError(f"unknown node kind {kind!r}; expected 'gpu' or 'cpu'") from None

    devices = [_computer(name)]
    group = 0
    if kind == "gpu":
        per_node = len(GPU_BUSES) // shape.numa_nodes
        for index, bus in enumerate(GPU_BUSES):
            devices.append(
                _pci_device(
                    bus=bus,
                    pci_class=0x030200,  # 3D controller
                    vendor=NVIDIA_VENDOR,
                    vendor_name="NVIDIA Corporation",
                    product=A100_SXM4_40GB,
                    product_name="GA100 [A100 SXM4 40GB]",
                    iommu_group=group,
                    numa_node=index // per_node,
                )
            )
            group += 1
    for numa_node, bus in enumerate(NIC_BUSES[: shape.numa_nodes]):
        devices.append(
            _pci_device(
                bus=bus,
                pci_class=0x020700,  # InfiniBand controller
                vendor=MELLANOX_VENDOR,
                vendor_name="Mellanox Technologies",
                product=CONNECTX6,
                product_name="MT28908 Family [ConnectX-6]",
                iommu_group=group,
                numa_node=numa_node,
            )
        )
        group += 1

    return f"""<?xml version='1.0'?>
<!-- {escape(name)}: simulated {kind} node for libvirt's test driver -->
<node>
  <cpu>
    <nodes>{shape.numa_nodes}</nodes>
    <sockets>{shape.sockets_per_node}</sockets>
    <cores>{shape.cores_per_socket}</cores>
    <threads>{shape.threads_per_core}</threads>
    <active>{shape.cpus}</active>
    <mhz>{shape.mhz}</mhz>
    <model>{escape(shape.model)}</model>
  </cpu>
  <memory>{shape.memory_gib * KIB_PER_GIB}</memory>
{"".join(devices)}</node>
"""


def write_fleet(directory: str | Path, gpu_nodes: int, cpu_nodes: int) -> dict[str, Path]:
    """Write ``gpu-01.xml``.. and ``cpu-01.xml``.. into ``directory``; return name -> path.

    Open a host with ``libvirt.open(f"test://{path}")`` (``path`` is absolute).
    """
    if gpu_nodes < 0 or cpu_nodes < 0:
        raise ValueError("node counts must not be negative")
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for kind, count in (("gpu", gpu_nodes), ("cpu", cpu_nodes)):
        for number in range(1, count + 1):
            name = f"{kind}-{number:02d}"
            path = root / f"{name}.xml"
            path.write_text(node_xml(kind, name), encoding="utf-8")
            paths[name] = path
    return paths
