"""Simulated mdx-style hosts for libvirt's test driver.

``node_xml(kind, name)`` returns a complete test-driver node description (``<node>`` root) that
``libvirt.open("test:///abs/path/node.xml")`` loads; ``write_fleet`` writes one such file per
host. ``host_inventory(kind)`` is the ``HostInventory`` such a host stands for: what
``LibvirtDriver.host_inventory()`` reads back from the file, and what a ``FakeDriver`` can be
given to play the same host without libvirt. No Django here: the host agent and its tests use
this module directly.

What libvirt's test driver does with the description (checked against libvirt 9.0, the
version these machines run; see tests/compute/test_simnode.py):

* ``<cpu>`` and ``<memory>`` feed ``getInfo()``. The CPU count is
  ``nodes * sockets * cores * threads``: in ``virNodeInfo`` ``sockets`` means sockets per NUMA
  node, so a 2-socket, 2-cell host is written as ``nodes=2, sockets=1``.
* Node devices (``<device>``) keep their PCI address, vendor and product ids, class,
  ``<iommuGroup>`` and ``<numa node=...>`` in ``XMLDesc()``, and the SR-IOV links: a VF's
  ``<capability type='phys_function'>`` (its PF's address) and a PF's
  ``<capability type='virt_functions' maxCount=...>`` (its VFs' addresses), so a VF is told
  from its PF the way it is on a real host.
* There is no way to describe NUMA cells: a file-loaded test connection builds its
  capabilities before reading the file and has no cells, so ``getCapabilities()`` shows
  ``<cells num='0'>`` and ``getCellsFreeMemory()`` fails ("Range exceeds
  available cells"). Per-cell placement of devices is visible through each device's
  ``<numa node>``; ``LibvirtDriver`` derives the cells' CPUs from ``getInfo()``'s node count
  (contiguous equal blocks), which is how ``host_inventory`` lays them out here. The
  capabilities' host arch is always i686 and ``<iommu support='no'>``, whatever the file
  says; ``getFreeMemory()`` is 0.
* A ``<driver>`` element on a device is dropped, so there is none here; the ``computer``
  device must carry a system ``<uuid>`` or the connection fails to open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from uuid import NAMESPACE_DNS, uuid5
from xml.sax.saxutils import escape

from compute.drivers.base import DeviceKind, HostInventory, NumaCell, PciAddress, PciDevice

Kind = Literal["gpu", "cpu"]

NVIDIA_VENDOR = 0x10DE
A100_SXM4_40GB = 0x20B0
MELLANOX_VENDOR = 0x15B3
CONNECTX6 = 0x101B
CONNECTX6_VF = 0x101C

# PCI bus of each A100 on a DGX A100-like board (GPUs 0-3 on NUMA node 0, 4-7 on node 1),
# and of one ConnectX-6 per NUMA node.
GPU_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
NIC_BUSES = (0x0C, 0x8D)
# SR-IOV virtual functions enabled on each ConnectX-6, as (slot, function) on the PF's bus:
# without ARI a device has 8 functions per slot, so VFs 1-7 follow the PF in slot 0 and the
# eighth opens slot 1.
VFS_PER_NIC = 8
VF_SLOT_FUNCTIONS = tuple(divmod(index, 8) for index in range(1, VFS_PER_NIC + 1))

KIB_PER_GIB = 1024 * 1024
HYPERVISOR = "TEST"  # what getType() answers on a test:// connection


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


def _shape(kind: Kind) -> NodeShape:
    try:
        return SHAPES[kind]
    except KeyError:
        raise ValueError(f"unknown node kind {kind!r}; expected 'gpu' or 'cpu'") from None


def pci_device_name(domain: int, bus: int, slot: int, function: int) -> str:
    """The node-device name libvirt gives a PCI device, e.g. ``pci_0000_07_00_0``."""
    return f"pci_{domain:04x}_{bus:02x}_{slot:02x}_{function:x}"


def _function(
    kind: DeviceKind, address: PciAddress, group: int, numa_node: int, **fields
) -> PciDevice:
    name = pci_device_name(address.domain, address.bus, address.slot, address.function)
    return PciDevice(name, address, kind, iommu_group=group, numa_node=numa_node, **fields)


def host_devices(kind: Kind) -> tuple[PciDevice, ...]:
    """The PCI functions of one ``kind`` of host, in the order ``node_xml`` writes them: on a
    GPU host eight A100s, four per NUMA node; on every host one ConnectX-6 per NUMA node, each
    followed by its ``VFS_PER_NIC`` virtual functions. Every function has its own IOMMU group
    (numbered in this order) and VFs share their PF's NUMA node."""
    shape = _shape(kind)
    devices: list[PciDevice] = []
    if kind == "gpu":
        per_node = len(GPU_BUSES) // shape.numa_nodes
        for index, bus in enumerate(GPU_BUSES):
            devices.append(
                _function(
                    DeviceKind.GPU,
                    PciAddress(0, bus, 0, 0),
                    len(devices),
                    index // per_node,
                    class_code=0x030200,  # 3D controller
                    vendor_id=NVIDIA_VENDOR,
                    vendor_name="NVIDIA Corporation",
                    product_id=A100_SXM4_40GB,
                    product_name="GA100 [A100 SXM4 40GB]",
                )
            )
    nic = {
        "class_code": 0x020700,  # InfiniBand controller
        "vendor_id": MELLANOX_VENDOR,
        "vendor_name": "Mellanox Technologies",
    }
    for numa_node, bus in enumerate(NIC_BUSES[: shape.numa_nodes]):
        pf = PciAddress(0, bus, 0, 0)
        devices.append(
            _function(
                DeviceKind.RDMA_PF,
                pf,
                len(devices),
                numa_node,
                product_id=CONNECTX6,
                product_name="MT28908 Family [ConnectX-6]",
                **nic,
            )
        )
        for slot, function in VF_SLOT_FUNCTIONS:
            devices.append(
                _function(
                    DeviceKind.RDMA_VF,
                    PciAddress(0, bus, slot, function),
                    len(devices),
                    numa_node,
                    product_id=CONNECTX6_VF,
                    product_name="MT28908 Family [ConnectX-6 Virtual Function]",
                    physical_function=pf,
                    **nic,
                )
            )
    return tuple(devices)


def host_cells(kind: Kind) -> tuple[NumaCell, ...]:
    """The NUMA cells of one ``kind`` of host: CPU ids in contiguous equal blocks, memory
    shared evenly."""
    shape = _shape(kind)
    per_cell = shape.cpus // shape.numa_nodes
    memory_mib = shape.memory_gib * 1024 // shape.numa_nodes
    return tuple(
        NumaCell(cell, tuple(range(cell * per_cell, (cell + 1) * per_cell)), memory_mib)
        for cell in range(shape.numa_nodes)
    )


def host_inventory(kind: Kind) -> HostInventory:
    """What a host written by ``node_xml(kind, ...)`` offers, devices sorted by address (as
    ``LibvirtDriver.host_inventory()`` reads it back)."""
    shape = _shape(kind)
    return HostInventory(
        cpus=shape.cpus,
        memory_mib=shape.memory_gib * 1024,
        cells=host_cells(kind),
        devices=tuple(sorted(host_devices(kind), key=lambda device: device.address)),
        hypervisor=HYPERVISOR,
    )


def _address_xml(address: PciAddress) -> str:
    return (
        f"<address domain='0x{address.domain:04x}' bus='0x{address.bus:02x}' "
        f"slot='0x{address.slot:02x}' function='0x{address.function:x}'/>"
    )


def _device_xml(device: PciDevice, virt_functions: list[PciAddress]) -> str:
    address = device.address
    sriov = ""
    if device.physical_function is not None:
        sriov += f"""
      <capability type='phys_function'>
        {_address_xml(device.physical_function)}
      </capability>"""
    if virt_functions:
        vfs = "".join(f"\n        {_address_xml(vf)}" for vf in virt_functions)
        sriov += f"""
      <capability type='virt_functions' maxCount='{len(virt_functions)}'>{vfs}
      </capability>"""
    return f"""  <device>
    <name>{device.name}</name>
    <parent>computer</parent>
    <capability type='pci'>
      <class>0x{device.class_code:06x}</class>
      <domain>{address.domain}</domain>
      <bus>{address.bus}</bus>
      <slot>{address.slot}</slot>
      <function>{address.function}</function>
      <product id='0x{device.product_id:04x}'>{escape(device.product_name)}</product>
      <vendor id='0x{device.vendor_id:04x}'>{escape(device.vendor_name)}</vendor>{sriov}
      <iommuGroup number='{device.iommu_group}'>
        {_address_xml(address)}
      </iommuGroup>
      <numa node='{device.numa_node}'/>
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
    shape = _shape(kind)
    functions = host_devices(kind)
    devices = [_computer(name)]
    for device in functions:
        vfs = [vf.address for vf in functions if vf.physical_function == device.address]
        devices.append(_device_xml(device, vfs))

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
