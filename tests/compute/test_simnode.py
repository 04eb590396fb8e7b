"""Simulated mdx hosts, checked through libvirt's own API (test driver, no database).

Only what libvirt hands back is asserted. Things the test driver does not carry, so not
asserted here: NUMA cells (a file-loaded test connection reports ``<cells num='0'>`` in
``getCapabilities()`` and ``getCellsFreeMemory()`` fails), the host arch in capabilities (always
i686) and free memory (0). GPU-to-NUMA placement is only visible per device, via
``<numa node>`` in the device XML. SR-IOV links (a VF's ``phys_function``, a PF's
``virt_functions``) are kept and asserted.
"""

import xml.etree.ElementTree as ET

import libvirt
import pytest

from compute.drivers import simnode

GPU_ADDRESSES = [
    "0000:07:00.0",
    "0000:0f:00.0",
    "0000:47:00.0",
    "0000:4e:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b7:00.0",
    "0000:bd:00.0",
]


def _open(path):
    conn = libvirt.open(f"test://{path}")
    assert conn is not None
    return conn


@pytest.fixture
def fleet(tmp_path):
    return simnode.write_fleet(tmp_path, gpu_nodes=2, cpu_nodes=3)


@pytest.fixture
def gpu_conn(fleet):
    conn = _open(fleet["gpu-01"])
    yield conn
    conn.close()


@pytest.fixture
def cpu_conn(fleet):
    conn = _open(fleet["cpu-01"])
    yield conn
    conn.close()


def _addr(element):
    return "{:04x}:{:02x}:{:02x}.{:x}".format(
        *(int(element.get(f), 16) for f in ("domain", "bus", "slot", "function"))
    )


def _pci_devices(conn):
    """Every PCI node device as a dict of what its libvirt XMLDesc says."""
    found = []
    for dev in conn.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV):
        root = ET.fromstring(dev.XMLDesc(0))
        cap = root.find("capability[@type='pci']")
        numa = cap.find("numa")
        group = cap.find("iommuGroup")
        pf = cap.find("capability[@type='phys_function']/address")
        vfs = cap.find("capability[@type='virt_functions']")
        found.append(
            {
                "name": dev.name(),
                "parent": dev.parent(),
                "class": int(cap.findtext("class"), 16),
                "vendor": int(cap.find("vendor").get("id"), 16),
                "product": int(cap.find("product").get("id"), 16),
                "product_name": cap.findtext("product"),
                "address": "{:04x}:{:02x}:{:02x}.{:x}".format(
                    *(int(cap.findtext(f)) for f in ("domain", "bus", "slot", "function"))
                ),
                "numa": None if numa is None else int(numa.get("node")),
                "iommu_group": None if group is None else int(group.get("number")),
                "iommu_members": []
                if group is None
                else [_addr(a) for a in group.findall("address")],
                "phys_function": None if pf is None else _addr(pf),
                "virt_functions": None
                if vfs is None
                else [_addr(a) for a in vfs.findall("address")],
                "max_vfs": None if vfs is None else int(vfs.get("maxCount")),
            }
        )
    return found


def _gpus(conn):
    return sorted(
        (
            d
            for d in _pci_devices(conn)
            if d["vendor"] == simnode.NVIDIA_VENDOR and d["class"] == 0x030200
        ),
        key=lambda d: d["address"],
    )


def test_gpu_node_has_eight_a100s_at_dgx_addresses(gpu_conn):
    gpus = _gpus(gpu_conn)
    assert len(gpus) == 8
    assert [g["address"] for g in gpus] == GPU_ADDRESSES
    for gpu in gpus:
        assert gpu["product"] == 0x20B0
        assert gpu["product_name"] == "GA100 [A100 SXM4 40GB]"
        assert gpu["parent"] == "computer"
        # libvirt's own name for the device, and lookup by it, agree with the address.
        assert gpu["name"] == "pci_" + gpu["address"].replace(":", "_").replace(".", "_")
        assert gpu_conn.nodeDeviceLookupByName(gpu["name"]).name() == gpu["name"]


def test_gpu_numa_placement_is_four_and_four(gpu_conn):
    gpus = _gpus(gpu_conn)
    assert [g["numa"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_each_gpu_has_its_own_iommu_group(gpu_conn):
    gpus = _gpus(gpu_conn)
    groups = [g["iommu_group"] for g in gpus]
    assert None not in groups
    assert len(set(groups)) == 8
    for gpu in gpus:
        assert gpu["iommu_members"] == [gpu["address"]]
    # ...and no other device shares a GPU's group.
    others = [d["iommu_group"] for d in _pci_devices(gpu_conn) if d not in gpus]
    assert not set(others) & set(groups)


def test_connectx6_per_numa_node(gpu_conn, cpu_conn):
    for conn in (gpu_conn, cpu_conn):
        nics = [
            d
            for d in _pci_devices(conn)
            if (d["vendor"], d["product"]) == (simnode.MELLANOX_VENDOR, simnode.CONNECTX6)
        ]
        assert sorted(n["numa"] for n in nics) == [0, 1]


def test_each_connectx6_has_eight_vfs_linked_both_ways(gpu_conn, cpu_conn):
    for conn in (gpu_conn, cpu_conn):
        devices = {d["address"]: d for d in _pci_devices(conn)}
        pfs = [d for d in devices.values() if d["product"] == simnode.CONNECTX6]
        assert len(pfs) == 2
        for pf in pfs:
            bus = pf["address"][5:7]
            expected = [f"0000:{bus}:00.{f}" for f in range(1, 8)] + [f"0000:{bus}:01.0"]
            assert pf["virt_functions"] == expected
            assert pf["max_vfs"] == 8
            assert pf["phys_function"] is None
            for address in expected:
                vf = devices[address]
                assert (vf["vendor"], vf["product"]) == (simnode.MELLANOX_VENDOR, 0x101C)
                assert vf["product_name"] == "MT28908 Family [ConnectX-6 Virtual Function]"
                assert vf["phys_function"] == pf["address"]
                assert vf["numa"] == pf["numa"]
                assert vf["iommu_members"] == [address]
                assert vf["name"] == "pci_" + address.replace(":", "_").replace(".", "_")
        groups = [d["iommu_group"] for d in devices.values()]
        assert len(set(groups)) == len(groups)


def test_gpu_node_info(gpu_conn):
    model, memory_mib, cpus, mhz, nodes, sockets, cores, threads = gpu_conn.getInfo()
    assert cpus == 128
    # virNodeInfo counts sockets per NUMA node: 2 cells x 1 socket x 32 cores x 2 threads.
    assert (nodes, sockets, cores, threads) == (2, 1, 32, 2)
    assert memory_mib == 460 * 1024
    assert model == "x86_64"
    assert mhz == 2400


def test_cpu_node_has_no_gpus_and_152_cpus(cpu_conn):
    assert _gpus(cpu_conn) == []
    assert not [d for d in _pci_devices(cpu_conn) if d["vendor"] == simnode.NVIDIA_VENDOR]
    _, memory_mib, cpus, _, nodes, *_ = cpu_conn.getInfo()
    assert cpus == 152
    assert nodes == 2
    assert memory_mib == 256 * 1024


def test_system_device_carries_host_name(gpu_conn):
    root = ET.fromstring(gpu_conn.nodeDeviceLookupByName("computer").XMLDesc(0))
    assert root.findtext("capability/product") == "gpu-01"
    assert root.findtext("capability/hardware/uuid") == simnode.host_uuid("gpu-01")


def test_test_driver_reports_no_numa_cells(gpu_conn):
    # Documents a limitation rather than a feature: if a libvirt upgrade starts reporting
    # cells, this fails and the simulator can start asserting them.
    caps = ET.fromstring(gpu_conn.getCapabilities())
    assert caps.find("host/topology/cells").get("num") == "0"


def test_write_fleet_names_and_files(tmp_path, fleet):
    assert list(fleet) == ["gpu-01", "gpu-02", "cpu-01", "cpu-02", "cpu-03"]
    for name, path in fleet.items():
        assert path == tmp_path.resolve() / f"{name}.xml"
        assert path.is_file()
        conn = _open(path)
        try:
            system = ET.fromstring(conn.nodeDeviceLookupByName("computer").XMLDesc(0))
            assert system.findtext("capability/product") == name
            expected_gpus = 8 if name.startswith("gpu-") else 0
            assert len(_gpus(conn)) == expected_gpus
        finally:
            conn.close()


def test_write_fleet_empty_and_invalid(tmp_path):
    assert simnode.write_fleet(tmp_path / "none", 0, 0) == {}
    with pytest.raises(ValueError):
        simnode.write_fleet(tmp_path, -1, 0)
    with pytest.raises(ValueError):
        simnode.node_xml("tpu", "x")  # type: ignore[arg-type]
