"""Host inventory and NUMA cells, read through every driver: the fake given a simulated host's
inventory, and the libvirt driver on libvirt's test driver loaded from ``simnode`` files (no
daemon). The libvirt-only tests at the end pin the parsing rules: cells derived from
``getInfo()`` when the capabilities list none, and which PCI functions count as what."""

import xml.etree.ElementTree as ET

import pytest

from compute.drivers import simnode
from compute.drivers.base import DeviceKind, DriverError, GuestSpec, NumaCell, PciAddress
from compute.drivers.fake import DEFAULT_CELLS, FakeDriver, default_inventory
from compute.drivers.libvirt import (
    LibvirtDriver,
    cells_from_node_info,
    classify_pci,
    parse_pci_device,
)
from tests.compute.test_simnode import GPU_ADDRESSES

# One ConnectX-6 per NUMA cell: PF at function 0, VFs at slot 0 functions 1-7 and slot 1.0.
PF_ADDRESSES = {0: "0000:0c:00.0", 1: "0000:8d:00.0"}


def vf_addresses(bus: int) -> list[str]:
    return [f"0000:{bus:02x}:00.{function}" for function in range(1, 8)] + [f"0000:{bus:02x}:01.0"]


@pytest.fixture
def fleet(tmp_path):
    return simnode.write_fleet(tmp_path, 1, 1)


@pytest.fixture(params=["fake", "libvirt"])
def open_host(request, fleet):
    """``open_host(kind)``: a driver for a simulated ``kind`` host ("gpu" or "cpu")."""
    opened = []

    def open_host(kind):
        if request.param == "fake":
            return FakeDriver(inventory=simnode.host_inventory(kind))
        driver = LibvirtDriver(f"test://{fleet[f'{kind}-01']}", poll_interval_s=0.001)
        opened.append(driver)
        return driver

    yield open_host
    for driver in opened:
        driver.close()


def of_kind(inventory, kind):
    return [device for device in inventory.devices if device.kind is kind]


class TestInventoryOfSimulatedHosts:
    def test_gpu_host_cpus_memory_and_cells(self, open_host):
        driver = open_host("gpu")
        inventory = driver.host_inventory()
        assert inventory.cpus == 128
        assert inventory.memory_mib == 460 * 1024
        assert inventory.cells == (
            NumaCell(0, tuple(range(64)), 230 * 1024),
            NumaCell(1, tuple(range(64, 128)), 230 * 1024),
        )
        assert driver.host_cells() == inventory.cells
        assert inventory.hypervisor == "TEST"

    def test_gpu_host_has_eight_a100s_four_per_cell(self, open_host):
        inventory = open_host("gpu").host_inventory()
        gpus = of_kind(inventory, DeviceKind.GPU)
        assert [str(gpu.address) for gpu in gpus] == GPU_ADDRESSES
        assert [gpu.numa_node for gpu in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
        for gpu in gpus:
            assert (gpu.vendor_id, gpu.product_id) == (0x10DE, 0x20B0)
            assert gpu.class_code == 0x030200
            assert gpu.product_name == "GA100 [A100 SXM4 40GB]"
            assert gpu.name == "pci_" + str(gpu.address).replace(":", "_").replace(".", "_")
            assert gpu.physical_function is None

    def test_every_function_has_its_own_iommu_group(self, open_host):
        for kind in ("gpu", "cpu"):
            groups = [device.iommu_group for device in open_host(kind).host_inventory().devices]
            assert None not in groups
            assert len(set(groups)) == len(groups)

    @pytest.mark.parametrize("kind", ["gpu", "cpu"])
    def test_one_connectx6_per_cell_with_eight_vfs(self, open_host, kind):
        inventory = open_host(kind).host_inventory()
        pfs = of_kind(inventory, DeviceKind.RDMA_PF)
        vfs = of_kind(inventory, DeviceKind.RDMA_VF)
        assert {pf.numa_node: str(pf.address) for pf in pfs} == PF_ADDRESSES
        assert len(vfs) == 16
        for pf in pfs:
            assert (pf.vendor_id, pf.product_id, pf.class_code) == (0x15B3, 0x101B, 0x020700)
            assert pf.physical_function is None
            mine = [vf for vf in vfs if vf.physical_function == pf.address]
            assert [str(vf.address) for vf in mine] == vf_addresses(pf.address.bus)
            for vf in mine:
                assert vf.numa_node == pf.numa_node
                assert (vf.vendor_id, vf.product_id) == (0x15B3, 0x101C)
                assert vf.product_name == "MT28908 Family [ConnectX-6 Virtual Function]"

    def test_cpu_host_has_152_cpus_and_no_gpus(self, open_host):
        driver = open_host("cpu")
        inventory = driver.host_inventory()
        assert inventory.cpus == 152
        assert inventory.memory_mib == 256 * 1024
        assert [cell.cpus for cell in inventory.cells] == [
            tuple(range(76)),
            tuple(range(76, 152)),
        ]
        assert of_kind(inventory, DeviceKind.GPU) == []
        assert len(inventory.devices) == 2 + 16

    def test_numa_pinned_guest_is_defined_on_the_cell_cpus(self, open_host):
        driver = open_host("gpu")
        spec = GuestSpec(
            vm_id="pinned-01", generation=1, name="train", vcpus=8, memory_mib=4096, numa_cell=1
        )
        driver.ensure_defined(spec)
        root = ET.fromstring(driver.domain_xml(spec.vm_id))
        assert [pin.get("cpuset") for pin in root.findall("cputune/vcpupin")] == ["64-127"] * 8
        assert root.find("numatune/memory").get("nodeset") == "1"
        with pytest.raises(DriverError):
            driver.ensure_defined(
                GuestSpec(
                    vm_id="pinned-02", generation=1, name="x", vcpus=1, memory_mib=64, numa_cell=2
                )
            )


# -- libvirt only -------------------------------------------------------------------------------


def test_libvirt_reads_back_exactly_what_simnode_describes(fleet):
    for kind in ("gpu", "cpu"):
        driver = LibvirtDriver(f"test://{fleet[f'{kind}-01']}")
        try:
            assert driver.host_inventory() == simnode.host_inventory(kind)
        finally:
            driver.close()


def test_libvirt_cells_come_from_capabilities_when_listed():
    # test:///default lists two cells of 8 CPUs (2 GiB and 4 GiB) in its capabilities.
    driver = LibvirtDriver("test:///default")
    try:
        cells = driver.host_cells()
        assert cells == (
            NumaCell(0, tuple(range(8)), 2048),
            NumaCell(1, tuple(range(8, 16)), 4096),
        )
        assert driver.host_cells() is cells  # cached per driver
        inventory = driver.host_inventory()
        assert inventory.cells == cells
        assert (inventory.cpus, inventory.devices) == (16, ())
    finally:
        driver.close()


def test_libvirt_leaves_out_functions_kumo_does_not_schedule(tmp_path):
    bridge = """  <device>
    <name>pci_0000_00_01_0</name>
    <parent>computer</parent>
    <capability type='pci'>
      <class>0x060400</class>
      <domain>0</domain><bus>0</bus><slot>1</slot><function>0</function>
      <product id='0x1452'>Family 17h PCIe Dummy Host Bridge</product>
      <vendor id='0x1022'>Advanced Micro Devices, Inc. [AMD]</vendor>
      <iommuGroup number='90'>
        <address domain='0x0000' bus='0x00' slot='0x01' function='0x0'/>
      </iommuGroup>
    </capability>
  </device>
"""
    path = tmp_path / "bridge.xml"
    path.write_text(simnode.node_xml("cpu", "cpu-09").replace("</node>", bridge + "</node>"))
    driver = LibvirtDriver(f"test://{path}")
    try:
        addresses = [str(device.address) for device in driver.host_inventory().devices]
        assert len(addresses) == 18
        assert "0000:00:01.0" not in addresses
    finally:
        driver.close()


@pytest.mark.parametrize(
    ("cpus", "memory_mib", "nodes", "expected"),
    [
        (128, 1000, 2, [(range(0, 64), 500), (range(64, 128), 500)]),
        (10, 301, 3, [(range(0, 4), 100), (range(4, 7), 100), (range(7, 10), 100)]),
        (16, 4096, 0, [(range(0, 16), 4096)]),  # no node count: one cell
    ],
)
def test_cells_from_node_info_split_cpus_into_contiguous_blocks(cpus, memory_mib, nodes, expected):
    assert cells_from_node_info(cpus, memory_mib, nodes) == tuple(
        NumaCell(cell, tuple(ids), memory) for cell, (ids, memory) in enumerate(expected)
    )


@pytest.mark.parametrize(
    ("vendor_id", "product_id", "class_code", "is_vf", "kind"),
    [
        (0x10DE, 0x20B0, 0x030200, False, DeviceKind.GPU),  # A100: 3D controller
        (0x10DE, 0x2230, 0x030000, False, DeviceKind.GPU),  # RTX A6000: VGA controller
        (0x10DE, 0x1AEF, 0x040300, False, DeviceKind.OTHER),  # a GPU's HDMI audio function
        (0x10DE, 0x22A3, 0x068000, False, DeviceKind.OTHER),  # NVSwitch bridge
        (0x15B3, 0x101B, 0x020700, False, DeviceKind.RDMA_PF),  # ConnectX-6, InfiniBand
        (0x15B3, 0x101D, 0x020000, False, DeviceKind.RDMA_PF),  # ConnectX-6 Dx, Ethernet
        (0x15B3, 0x101C, 0x020700, False, DeviceKind.RDMA_VF),  # ConnectX-6 VF by product id
        (0x15B3, 0x101E, 0x020000, False, DeviceKind.RDMA_VF),  # mlx5Gen VF by product id
        (0x15B3, 0x9999, 0x020000, True, DeviceKind.RDMA_VF),  # unknown id, has a PF
        (0x15B3, 0xA2D6, 0x080000, False, DeviceKind.OTHER),  # BlueField-2 SoC management
        (0x8086, 0x1593, 0x020000, False, DeviceKind.OTHER),  # Intel E810 NIC
    ],
)
def test_classify_pci(vendor_id, product_id, class_code, is_vf, kind):
    assert (
        classify_pci(vendor_id=vendor_id, product_id=product_id, class_code=class_code, is_vf=is_vf)
        is kind
    )


def test_parse_pci_device_without_numa_or_iommu_group():
    device = parse_pci_device(
        """<device><name>pci_0000_3b_00_2</name><capability type='pci'>
        <class>0x020000</class><domain>0</domain><bus>59</bus><slot>0</slot>
        <function>2</function><product id='0x101e'>mlx5Gen Virtual Function</product>
        <vendor id='0x15b3'>Mellanox Technologies</vendor>
        <capability type='phys_function'>
          <address domain='0x0000' bus='0x3b' slot='0x00' function='0x0'/>
        </capability>
        <numa node='-1'/></capability></device>"""
    )
    assert device.address == PciAddress(0, 0x3B, 0, 2)
    assert device.kind is DeviceKind.RDMA_VF
    assert device.physical_function == PciAddress(0, 0x3B, 0, 0)
    assert (device.numa_node, device.iommu_group) == (None, None)
    with pytest.raises(ValueError):
        parse_pci_device("<device><name>usb_1</name><capability type='usb_device'/></device>")


# -- fake only ----------------------------------------------------------------------------------


def test_fake_default_inventory_matches_its_cells():
    driver = FakeDriver()
    inventory = driver.host_inventory()
    assert inventory == default_inventory()
    assert {cell.id: cell.cpus for cell in driver.host_cells()} == dict(DEFAULT_CELLS)
    assert driver.cells == dict(DEFAULT_CELLS)
    gpus = of_kind(inventory, DeviceKind.GPU)
    assert [gpu.numa_node for gpu in gpus] == [0, 1]
    vfs = of_kind(inventory, DeviceKind.RDMA_VF)
    (pf,) = of_kind(inventory, DeviceKind.RDMA_PF)
    assert [vf.physical_function for vf in vfs] == [pf.address, pf.address]


def test_fake_takes_cells_or_an_inventory_not_both():
    driver = FakeDriver(cells={0: range(4)})
    assert driver.host_inventory().cells == (NumaCell(0, (0, 1, 2, 3), 4096),)
    assert driver.cells == {0: (0, 1, 2, 3)}
    inventory = simnode.host_inventory("gpu")
    assert FakeDriver(inventory=inventory).cells[1] == tuple(range(64, 128))
    with pytest.raises(ValueError):
        FakeDriver(cells={0: range(4)}, inventory=inventory)


def test_fake_inventory_failure_can_be_injected():
    driver = FakeDriver()
    driver.fail_next("host_inventory")
    with pytest.raises(DriverError):
        driver.host_inventory()
    assert driver.host_inventory() == default_inventory()
