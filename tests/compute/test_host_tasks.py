"""The compute side of the host agent: ``host_tasks.apply`` converging one guest to a
``VmApply``, on a simulated GPU host run by libvirt's test driver (read back through libvirt),
and on the fake for failures. Repeats and stale generations change nothing."""

import xml.etree.ElementTree as ET

import pytest
import yaml

from compute import host_tasks
from compute.drivers import cloudinit, nccl, simnode
from compute.drivers.base import DriverError, PowerState
from compute.drivers.domain_xml import parse_hostdev_addresses, parse_kumo_metadata
from compute.drivers.fake import FakeDriver
from compute.drivers.libvirt import LibvirtDriver
from compute.protocol import ABSENT, DeviceWire, VmApply
from controlplane.agent import runtime
from controlplane.agent.config import AgentConfig

VM = "0b4e2c1a-5d6f-4e3b-9a8c-7d6e5f4a3b2c"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0bXW1ZsJpEZx8o8DE2oqQxJgG6a4rGBpOIxYIJ2dJi ai@lab"
GPUS_CELL_1 = [d for d in simnode.host_devices("gpu") if d.numa_node == 1 and d.kind == "gpu"]


@pytest.fixture(autouse=True)
def agent_config(tmp_path):
    runtime.configure(AgentConfig.from_env(host="gpu-01", instances_dir=tmp_path / "instances"))
    yield
    runtime.configure(None)


@pytest.fixture
def hv(tmp_path):
    fleet = simnode.write_fleet(tmp_path / "fleet", 1, 0)
    driver = LibvirtDriver(f"test://{fleet['gpu-01']}", poll_interval_s=0.001)
    yield driver
    driver.close()


def message(generation=1, desired="running", gpus=2, **fields):
    devices = tuple(
        DeviceWire(
            address=str(d.address),
            kind=d.kind.value,
            numa_node=d.numa_node,
            class_code=d.class_code,
            vendor_id=d.vendor_id,
            product_id=d.product_id,
        )
        for d in GPUS_CELL_1[:gpus]
    )
    values = {
        "vm_id": VM,
        "generation": generation,
        "desired": desired,
        "name": "lab/train-01",
        "hostname": "train-01",
        "vcpus": 8,
        "memory_mib": 8192,
        "numa_cell": 1,
        "devices": devices,
        "ssh_keys": (KEY,),
        "user_data": "#cloud-config\npackages: [htop]\n",
        "graceful_timeout_s": 0.5,
    }
    values.update(fields)
    return VmApply(**values)


def test_apply_defines_and_starts_the_guest_with_its_gpus_and_seed(hv):
    assert host_tasks.apply(message(), hv) == (1, "running")
    xml = hv.domain_xml(VM)  # read back through libvirt
    assert parse_hostdev_addresses(xml) == [str(d.address) for d in GPUS_CELL_1[:2]]
    assert parse_kumo_metadata(xml).generation == 1
    root = ET.fromstring(xml)
    cdrom = root.find("devices/disk[@device='cdrom']/source").get("file")
    seed = cloudinit.read_seed(cdrom)
    assert yaml.safe_load(seed["meta-data"])["public-keys"] == [KEY]
    assert seed["user-data"] == "#cloud-config\npackages: [htop]\n"
    files = {f["path"]: f["content"] for f in yaml.safe_load(seed["vendor-data"])["write_files"]}
    topology = ET.fromstring(files[nccl.TOPOLOGY_PATH])
    assert len(topology.findall("cpu/pci/pci")) == 2
    assert [c.get("cpuset") for c in root.findall("cputune/vcpupin")] == ["64-127"] * 8


def test_repeating_a_message_changes_nothing(hv):
    host_tasks.apply(message(), hv)
    xml = hv.domain_xml(VM)
    assert host_tasks.apply(message(), hv) == (1, "running")
    assert hv.domain_xml(VM) == xml
    assert [g.vm_id for g in hv.list_guests()] == [VM]


def test_a_stale_generation_is_ignored(hv):
    host_tasks.apply(message(generation=3), hv)
    assert host_tasks.apply(message(generation=2, desired="stopped"), hv) == (3, "running")
    assert hv.get_guest(VM).power is PowerState.RUNNING


def test_stop_then_start_through_new_generations(hv):
    host_tasks.apply(message(), hv)
    assert host_tasks.apply(message(generation=2, desired="stopped"), hv) == (2, "shutoff")
    assert host_tasks.apply(message(generation=3), hv) == (3, "running")


def test_reboot_power_cycles_once_per_generation():
    fake = FakeDriver(inventory=simnode.host_inventory("gpu"))
    host_tasks.apply(message(), fake)
    calls = []
    original = fake.ensure_stopped
    fake.ensure_stopped = lambda vm_id, **kw: calls.append(vm_id) or original(vm_id, **kw)
    host_tasks.apply(message(generation=2, reboot=True), fake)
    host_tasks.apply(message(generation=2, reboot=True), fake)  # re-delivered
    assert calls == [VM]
    assert fake.get_guest(VM).power is PowerState.RUNNING


def test_absent_removes_the_guest_and_its_files_and_repeats_safely(hv, tmp_path):
    host_tasks.apply(message(), hv)
    assert (tmp_path / "instances" / VM / "seed.iso").exists()
    assert host_tasks.apply(message(generation=2, desired=ABSENT), hv) == (2, ABSENT)
    assert host_tasks.apply(message(generation=2, desired=ABSENT), hv) == (2, ABSENT)
    assert hv.list_guests() == []
    assert not (tmp_path / "instances" / VM).exists()


def test_a_cpu_guest_gets_no_nccl_files(hv):
    host_tasks.apply(message(gpus=0, numa_cell=None), hv)
    root = ET.fromstring(hv.domain_xml(VM))
    seed = cloudinit.read_seed(root.find("devices/disk[@device='cdrom']/source").get("file"))
    assert seed["vendor-data"] == ""
    assert root.find("devices/hostdev") is None


def test_a_driver_failure_is_raised_and_leaves_a_retry_to_converge():
    fake = FakeDriver(inventory=simnode.host_inventory("gpu"))
    fake.fail_next("ensure_running")
    with pytest.raises(DriverError):
        host_tasks.apply(message(), fake)
    assert fake.get_guest(VM).power is PowerState.SHUTOFF  # defined, not started
    assert host_tasks.apply(message(), fake) == (1, "running")
