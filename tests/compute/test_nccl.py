"""NCCL topology for passthrough guests: every busid is the device's guest address from the
same layout the domain XML is built from, on the guest NUMA cell of its host cell."""

import xml.etree.ElementTree as ET

import pytest

from compute.drivers import nccl, simnode
from compute.drivers.base import DeviceKind, GuestSpec, PassthroughDevice
from compute.drivers.domain_xml import build_domain_xml, guest_pci_layout

INVENTORY = simnode.host_inventory("gpu")
CELLS = simnode.host_cells("gpu")


def passthrough(kind, *, cell=None, count=None):
    found = [
        d for d in INVENTORY.devices if d.kind is kind and (cell is None or d.numa_node == cell)
    ]
    return tuple(
        PassthroughDevice(
            address=d.address,
            kind=d.kind,
            numa_node=d.numa_node,
            class_code=d.class_code,
            vendor_id=d.vendor_id,
            product_id=d.product_id,
        )
        for d in found[:count]
    )


def guest_bus_of_hostdevs(spec):
    """Guest bus of each hostdev, read from the domain XML, by host address."""
    root = ET.fromstring(build_domain_xml(spec, cells=CELLS))
    found = {}
    for hostdev in root.iterfind("devices/hostdev"):
        src = hostdev.find("source/address")
        host = f"{int(src.get('domain'), 16):04x}:{int(src.get('bus'), 16):02x}:" + (
            f"{int(src.get('slot'), 16):02x}.{int(src.get('function'), 16)}"
        )
        port_index = hostdev.find("address").get("bus")
        found[host] = int(port_index, 16)
    return found


def test_whole_node_guest_has_two_cells_each_with_its_four_gpus():
    devices = passthrough(DeviceKind.GPU)
    spec = GuestSpec(vm_id="v8", generation=1, name="x", vcpus=64, memory_mib=4096, devices=devices)
    root = ET.fromstring(nccl.topology_xml(spec))
    assert root.tag == "system" and root.get("version") == "1"
    cpus = root.findall("cpu")
    assert [c.get("numaid") for c in cpus] == ["0", "1"]
    # vCPUs 0-31 on guest cell 0, 32-63 on guest cell 1.
    assert [c.get("affinity") for c in cpus] == ["ffffffff", "ffffffff,00000000"]
    layout = {str(s.host_address): s for s in guest_pci_layout(spec)}
    for cell, cpu in zip((0, 1), cpus, strict=True):
        (switch,) = cpu.findall("pci")
        assert switch.get("class") == "0x060400"
        gpus = switch.findall("pci")
        expected = [
            str(layout[str(d.address)].guest_address) for d in devices if d.numa_node == cell
        ]
        assert [g.get("busid") for g in gpus] == expected
        assert {g.get("class") for g in gpus} == {"0x030200"}
        assert {(g.get("vendor"), g.get("device")) for g in gpus} == {("0x10de", "0x20b0")}


def test_gpus_and_rdma_vfs_of_one_cell_share_one_switch():
    devices = passthrough(DeviceKind.GPU, cell=1, count=2) + passthrough(
        DeviceKind.RDMA_VF, cell=1, count=1
    )
    spec = GuestSpec(
        vm_id="v2", generation=1, name="x", vcpus=8, memory_mib=4096, numa_cell=1, devices=devices
    )
    root = ET.fromstring(nccl.topology_xml(spec))
    (cpu,) = root.findall("cpu")
    assert cpu.get("numaid") == "0" and cpu.get("affinity") == "000000ff"
    (switch,) = cpu.findall("pci")
    classes = sorted(p.get("class") for p in switch.findall("pci"))
    assert classes == ["0x020700", "0x030200", "0x030200"]


def test_busids_are_the_addresses_the_domain_xml_gives_the_devices():
    devices = passthrough(DeviceKind.GPU, cell=0)
    spec = GuestSpec(
        vm_id="v4", generation=1, name="x", vcpus=16, memory_mib=4096, numa_cell=0, devices=devices
    )
    root = ET.fromstring(build_domain_xml(spec, cells=CELLS))
    # Each hostdev sits behind a root port on the cell's pcie-expander-bus; the guest bus of
    # root port j is the expander's busNr + 1 + j (see domain_xml's module docstring).
    expander = root.find("devices/controller[@model='pcie-expander-bus']")
    bus_nr = int(expander.find("target").get("busNr"))
    ports = {
        int(c.get("index")): int(c.find("address").get("slot"), 16)
        for c in root.iterfind("devices/controller[@model='pcie-root-port']")
        if c.find("address") is not None  # the spare hot-plug ports: libvirt places them
    }
    by_host = guest_bus_of_hostdevs(spec)
    expected = sorted(f"0000:{bus_nr + 1 + ports[port]:02x}:00.0" for port in by_host.values())
    busids = [p.get("busid") for p in ET.fromstring(nccl.topology_xml(spec)).iter("pci")][1:]
    assert sorted(busids) == expected


def test_a_guest_without_gpus_gets_no_files():
    spec = GuestSpec(vm_id="c1", generation=1, name="x", vcpus=2, memory_mib=1024)
    assert nccl.topology_xml(spec) is None
    assert nccl.guest_files(spec) == {}


def test_guest_files_name_the_topology_in_nccl_conf():
    spec = GuestSpec(
        vm_id="v1",
        generation=1,
        name="x",
        vcpus=4,
        memory_mib=1024,
        numa_cell=0,
        devices=passthrough(DeviceKind.GPU, cell=0, count=1),
    )
    files = nccl.guest_files(spec)
    assert files[nccl.CONF_PATH] == f"NCCL_TOPO_FILE={nccl.TOPOLOGY_PATH}\n"
    assert ET.fromstring(files[nccl.TOPOLOGY_PATH]).tag == "system"


@pytest.mark.parametrize(
    ("cpus", "mask"),
    [
        ([0], "00000001"),
        (range(8), "000000ff"),
        ([31, 32], "00000001,80000000"),
        ([64], "00000001,00000000,00000000"),
    ],
)
def test_cpu_affinity_is_a_linux_cpumask(cpus, mask):
    assert nccl.cpu_affinity(cpus) == mask
