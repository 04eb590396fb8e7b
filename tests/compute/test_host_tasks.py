"""The compute side of the host agent: ``host_tasks.apply`` converging one guest to a
``VmApply``, on a simulated GPU host run by libvirt's test driver (read back through libvirt),
and on the fake for failures. Repeats and stale generations change nothing. A guest's tap
NICs get their host taps before it starts on a real host (a throwaway network namespace
here), never on a simulated one."""

import errno
import fcntl
import functools
import json
import os
import shutil
import struct
import subprocess
import types
import uuid
import xml.etree.ElementTree as ET

import pytest
import yaml

from compute import host_tasks
from compute.drivers import cloudinit, nccl, simnode
from compute.drivers.base import DriverError, GuestNic, NicKind, PowerState
from compute.drivers.domain_xml import parse_hostdev_addresses, parse_kumo_metadata
from compute.drivers.fake import FakeDriver
from compute.drivers.libvirt import LibvirtDriver
from compute.protocol import ABSENT, DeviceWire, InterfaceWire, VmApply
from controlplane.agent import runtime
from controlplane.agent.config import AgentConfig
from network.drivers.base import NetworkDriverError
from network.drivers.netlink import IFF_NO_PI, IFF_TAP, TUNSETIFF, Netlink, netns_entered

VM = "0b4e2c1a-5d6f-4e3b-9a8c-7d6e5f4a3b2c"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0bXW1ZsJpEZx8o8DE2oqQxJgG6a4rGBpOIxYIJ2dJi ai@lab"
GPUS_CELL_1 = [d for d in simnode.host_devices("gpu") if d.numa_node == 1 and d.kind == "gpu"]
VF_CELL_1 = next(d for d in simnode.host_devices("gpu") if d.numa_node == 1 and d.kind == "rdma_vf")
TAP_NIC = InterfaceWire(
    port_id="0a1b2c3d4e5f4a0b8c9d",
    mac="52:54:00:0A:00:01",  # the wire may send upper case; libvirt and the guest see lower
    mtu=1450,
    device="tp-0a1b2c3d4e5f",
    addresses=("192.168.10.11/24",),
    gateway="192.168.10.1",
    dns=("192.168.10.1",),
)
VF_NIC = InterfaceWire(
    port_id="5f4e3d2c1b0a4a0b8c9d",
    mac="52:54:00:0b:00:01",
    mtu=9000,
    kind="vf",
    pci_address=str(VF_CELL_1.address),
    addresses=("172.16.0.9/16",),
)


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


def device_wire(d) -> DeviceWire:
    return DeviceWire(
        address=str(d.address),
        kind=d.kind.value,
        numa_node=d.numa_node,
        class_code=d.class_code,
        vendor_id=d.vendor_id,
        product_id=d.product_id,
    )


def message(generation=1, desired="running", gpus=2, **fields):
    devices = tuple(device_wire(d) for d in GPUS_CELL_1[:gpus])
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


# -- NICs -----------------------------------------------------------------------------------


def _no_netlink():
    raise AssertionError("netlink opened on a simulated host")


def nic_message(**fields) -> VmApply:
    """A GPU guest with one tap NIC and one RDMA VF NIC (the VF passed through as a device)."""
    devices = (*message().devices, device_wire(VF_CELL_1))
    return message(devices=devices, interfaces=(TAP_NIC, VF_NIC), **fields)


def test_nics_reach_the_domain_and_the_seed_and_a_repeat_changes_nothing(hv, monkeypatch):
    monkeypatch.setattr(host_tasks, "Netlink", _no_netlink)
    assert host_tasks.apply(nic_message(), hv) == (1, "running")
    xml = hv.domain_xml(VM)  # read back through libvirt
    root = ET.fromstring(xml)
    [interface] = root.findall("devices/interface")  # the VF NIC is its hostdev only
    assert interface.find("mac").get("address") == "52:54:00:0a:00:01"
    assert interface.find("target").attrib == {"dev": "tp-0a1b2c3d4e5f", "managed": "no"}
    assert interface.find("mtu").get("size") == "1450"
    assert str(VF_CELL_1.address) in parse_hostdev_addresses(xml)
    seed_path = root.find("devices/disk[@device='cdrom']/source").get("file")
    ethernets = yaml.safe_load(cloudinit.read_seed(seed_path)["network-config"])["ethernets"]
    assert ethernets["ens-0"]["match"] == {"macaddress": "52:54:00:0a:00:01"}
    assert ethernets["ens-0"]["routes"] == [{"to": "0.0.0.0/0", "via": "192.168.10.1"}]
    assert ethernets["ens-1"]["match"] == {"macaddress": "52:54:00:0b:00:01"}
    assert ethernets["ens-1"]["addresses"] == ["172.16.0.9/16"]
    seed = os.stat(seed_path)

    assert host_tasks.apply(nic_message(), hv) == (1, "running")
    assert hv.domain_xml(VM) == xml
    assert (os.stat(seed_path).st_ino, os.stat(seed_path).st_mtime_ns) == (
        seed.st_ino,
        seed.st_mtime_ns,
    )


def test_a_nic_on_a_device_not_passed_through_is_refused_before_anything_is_defined(hv):
    with pytest.raises(ValueError, match="not a passed-through VF"):
        host_tasks.apply(message(interfaces=(VF_NIC,)), hv)
    assert hv.list_guests() == []


class _RealFake(FakeDriver):
    """The fake as a real host: not simulated, and it records which taps exist in
    ``netns`` whenever a guest is started."""

    simulated = False

    def __init__(self, netns: str) -> None:
        super().__init__(inventory=simnode.host_inventory("gpu"))
        self.netns = netns
        self.taps_at_start: list[set[str]] = []

    def ensure_running(self, vm_id):
        nl = Netlink(self.netns)
        try:
            self.taps_at_start.append({n for n, link in nl.links().items() if link.kind == "tun"})
        finally:
            nl.close()
        return super().ensure_running(vm_id)


@pytest.fixture
def netns():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (a network namespace)")
    name = f"kumo-ct-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    yield name
    subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def test_a_real_host_makes_missing_taps_before_the_guest_starts(netns, monkeypatch, tmp_path):
    sockets: list[Netlink] = []

    def netlink() -> Netlink:
        sockets.append(Netlink(netns))
        return sockets[-1]

    monkeypatch.setattr(host_tasks, "Netlink", netlink)
    root_disk = tmp_path / "instances" / VM / "root.qcow2"  # a real host made it earlier
    root_disk.parent.mkdir(parents=True)
    root_disk.touch()
    second = InterfaceWire(port_id="9f8e", mac="52:54:00:0a:00:02", mtu=1450, device="tp-9f8e")
    hv = _RealFake(netns)
    msg = message(gpus=0, numa_cell=None, interfaces=(TAP_NIC, second))
    Netlink(netns).add_tap("tp-9f8e")  # the network agent was first for this one

    assert host_tasks.apply(msg, hv) == (1, "running")
    assert hv.taps_at_start == [{"tp-0a1b2c3d4e5f", "tp-9f8e"}]
    assert sockets[0].writes == 1  # only the missing tap was made
    tap = Netlink(netns).links()["tp-0a1b2c3d4e5f"]
    assert (tap.kind, tap.up, tap.master) == ("tun", False, 0)  # the network agent's to bridge

    assert host_tasks.apply(msg, hv) == (1, "running")
    assert sockets[1].writes == 0  # a repeat makes nothing
    assert all(nl.netns == netns for nl in sockets)


class _Qemu(_RealFake):
    """The fake as a real host whose start opens each tap NIC as libvirt does for QEMU
    (TUNSETIFF on the device of that name in ``netns``) and keeps it open while the guest
    runs: a tap some other file holds refuses the start with EBUSY, in libvirt's words.
    ``late_holder``: the first start finds the tap taken just after the taps were looked
    at; ``brief``: and let go of again as soon as the start was refused."""

    def __init__(self, netns: str, *, late_holder: bool = False, brief: bool = False) -> None:
        super().__init__(netns)
        self.late_holder, self.brief = late_holder, brief
        self.files: dict[str, list[int]] = {}
        self.holders: list[int] = []
        self.starts = 0

    def ensure_running(self, vm_id):
        if self.get_guest(vm_id).power is PowerState.RUNNING:
            return super().ensure_running(vm_id)
        self.starts += 1
        names = [n.device for n in self._get(vm_id).spec.nics if n.kind is NicKind.TAP]
        if self.late_holder and self.starts == 1:
            self.holders = [_hold(self.netns, name) for name in names]
        opened = []
        for name in names:
            try:
                opened.append(_hold(self.netns, name))
            except OSError as e:
                for fd in opened + (self.holders if self.brief else []):
                    os.close(fd)
                if self.brief:
                    self.holders = []
                raise DriverError(
                    f"start vm {vm_id}: Unable to create tap device {name}: {e.strerror}"
                ) from e
        try:
            state = super().ensure_running(vm_id)
        except DriverError:
            for fd in opened:  # a start that failed leaves no QEMU holding its taps
                os.close(fd)
            raise
        self.files[vm_id] = opened
        return state


def _hold(netns: str, name: str) -> int:
    """A file attached to tap ``name`` in ``netns``, as a QEMU holds its NIC's."""
    with netns_entered(netns):
        fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


@pytest.fixture
def tap_host(netns, monkeypatch, tmp_path):
    """A real host's tap side in ``netns``: the tasks' netlink there, the root disk made."""
    monkeypatch.setattr(host_tasks, "Netlink", lambda: Netlink(netns))
    root_disk = tmp_path / "instances" / VM / "root.qcow2"
    root_disk.parent.mkdir(parents=True)
    root_disk.touch()
    fds: list[int] = []
    yield fds
    for fd in fds:
        os.close(fd)


def test_a_tap_still_held_when_its_guest_starts_is_made_again_and_its_holder_named(
    netns, tap_host, caplog
):
    name = TAP_NIC.device
    Netlink(netns).add_tap(name)
    stale = Netlink(netns).links()[name]
    tap_host.append(_hold(netns, name))  # a QEMU that has not let go of it yet
    assert Netlink(netns).links()[name].carrier
    hv = _Qemu(netns)
    tap_host.extend(hv.files.setdefault(VM, []))

    with caplog.at_level("WARNING", logger="compute.host_tasks"):
        assert host_tasks.apply(message(gpus=0, numa_cell=None, interfaces=(TAP_NIC,)), hv) == (
            1,
            "running",
        )
    tap_host.extend(hv.files[VM])
    fresh = Netlink(netns).links()[name]
    assert fresh.index != stale.index and fresh.carrier  # a new device, the guest's own
    assert f"{os.getpid()} (" in caplog.text and name in caplog.text  # who held it
    assert hv.starts == 1


def test_a_start_refused_by_a_late_holder_makes_the_tap_again_and_starts_once_more(netns, tap_host):
    hv = _Qemu(netns, late_holder=True)
    assert host_tasks.apply(message(gpus=0, numa_cell=None, interfaces=(TAP_NIC,)), hv) == (
        1,
        "running",
    )
    tap_host.extend([*hv.holders, *hv.files[VM]])
    assert hv.starts == 2
    assert Netlink(netns).links()[TAP_NIC.device].carrier


def test_a_start_refused_over_a_tap_whose_holder_let_go_is_tried_once_more(netns, tap_host):
    hv = _Qemu(netns, late_holder=True, brief=True)
    assert host_tasks.apply(message(gpus=0, numa_cell=None, interfaces=(TAP_NIC,)), hv) == (
        1,
        "running",
    )
    tap_host.extend(hv.files[VM])
    assert hv.starts == 2 and hv.holders == []


def test_a_start_refused_for_another_reason_is_not_tried_again(netns, tap_host):
    hv = _Qemu(netns)
    hv.fail_next("ensure_running", DriverError("start vm: cannot access storage file"))
    with pytest.raises(DriverError, match="storage file"):
        host_tasks.apply(message(gpus=0, numa_cell=None, interfaces=(TAP_NIC,)), hv)
    assert [call for call in hv.calls if call[0] == "ensure_running"] == [("ensure_running", VM)]


def test_a_running_guests_tap_is_never_made_again(tap_host, netns):
    hv = _Qemu(netns)
    tapped = {"gpus": 0, "numa_cell": None, "interfaces": (TAP_NIC,)}
    assert host_tasks.apply(message(**tapped), hv) == (1, "running")
    tap_host.extend(hv.files[VM])
    before = Netlink(netns).links()[TAP_NIC.device]
    # A new generation while it runs (a host without a separate network namespace: the
    # taps are looked at before every start, the running guest's included).
    assert host_tasks.apply(message(generation=2, **tapped), hv) == (2, "running")
    assert Netlink(netns).links()[TAP_NIC.device] == before
    assert hv.starts == 1


class _StaleDump:
    """A netlink stand-in whose dump misses devices that exist, so every add is refused."""

    def __init__(self, code: int) -> None:
        self.code = code

    def links(self):
        return {}

    def add_tap(self, name):
        raise NetworkDriverError(f"add tap {name}: refused", errno=self.code)


def test_ensure_taps_takes_already_exists_as_success_and_other_refusals_as_driver_errors():
    nics = (GuestNic(mac="52:54:00:0a:00:01", mtu=1450, device="tp-x"),)
    assert host_tasks.ensure_taps(nics, _StaleDump(errno.EEXIST)) == []
    with pytest.raises(DriverError, match="tp-x"):
        host_tasks.ensure_taps(nics, _StaleDump(errno.EPERM))


def test_a_simulated_host_never_opens_netlink(monkeypatch):
    monkeypatch.setattr(host_tasks, "Netlink", _no_netlink)
    fake = FakeDriver(inventory=simnode.host_inventory("gpu"))
    assert host_tasks.apply(message(gpus=0, numa_cell=None, interfaces=(TAP_NIC,)), fake) == (
        1,
        "running",
    )


def test_a_kept_disk_stands_alone_with_what_the_guest_wrote(tmp_path):
    """Shelve writes the overlay and its image as one file: another host boots it without
    that image in its cache, or with the image gone."""
    qemu_img, qemu_io = shutil.which("qemu-img"), shutil.which("qemu-io")
    if not (qemu_img and qemu_io):
        pytest.skip("needs qemu-img and qemu-io (qemu-utils)")
    image = tmp_path / "image-cache" / "gpu-01" / "base.raw"
    image.parent.mkdir(parents=True)
    with open(image, "wb") as f:
        f.write(b"kumo image")
        f.truncate(4 << 20)
    overlay = host_tasks.instance_dir(VM) / "root.qcow2"
    overlay.parent.mkdir(parents=True)
    run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=60)
    run([qemu_img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image), str(overlay)])
    run([qemu_io, "-c", "write -P 0x61 1M 64k", str(overlay)])  # what the guest wrote
    kept = tmp_path / "shelved" / f"{VM}.qcow2"
    real_host = types.SimpleNamespace(simulated=False)

    host_tasks.keep_root_disk(VM, str(kept), real_host)
    image.unlink()  # the image's copy gone from every cache
    info = json.loads(run([qemu_img, "info", "--output=json", str(kept)]).stdout)
    assert info["format"] == "qcow2" and "backing-filename" not in info
    raw = tmp_path / "kept.raw"
    run([qemu_img, "convert", "-O", "raw", str(kept), str(raw)])
    data = raw.read_bytes()
    assert data[:10] == b"kumo image" and data[1 << 20 : (1 << 20) + (64 << 10)] == b"a" * (
        64 << 10
    )
    assert not kept.with_suffix(".partial").exists()

    written = kept.stat().st_mtime_ns
    overlay.write_bytes(b"changed after")  # a repeat never writes the kept disk again
    host_tasks.keep_root_disk(VM, str(kept), real_host)  # a repeated task changes nothing
    assert kept.stat().st_mtime_ns == written
