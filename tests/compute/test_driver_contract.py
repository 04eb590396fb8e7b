"""The hypervisor driver contract, run against every driver: the in-memory fake and the
libvirt driver on libvirt's own test hypervisor (``test:///default``, no daemon needed).
Fake-only behaviour (failure injection, GPU accounting) is tested at the end."""

import uuid
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from compute.drivers import nccl
from compute.drivers.base import (
    DeviceKind,
    DiskSpec,
    DriverError,
    GuestNic,
    GuestNotFound,
    GuestSpec,
    GuestState,
    HypervisorDriver,
    NicKind,
    PassthroughDevice,
    PciAddress,
    PowerState,
)
from compute.drivers.domain_xml import (
    HOTPLUG_PORTS,
    KUMO_NS,
    build_domain_xml,
    domain_uuid,
    parse_hostdev_addresses,
    parse_kumo_metadata,
)
from compute.drivers.fake import FakeDriver
from compute.drivers.libvirt import LibvirtDriver

GPU_A = PciAddress.parse("0000:3b:00.0")
GPU_B = PciAddress.parse("0000:af:00.1")
VF = PciAddress.parse("0000:5e:00.1")
TAPS = (
    GuestNic(mac="52:54:00:0a:00:01", mtu=1450, device="tp-0a1b2c3d4e5f"),
    GuestNic(mac="52:54:00:0a:00:02", mtu=9000, device="tp-5f4e3d2c1b0a"),
)
FOREIGN_XML = """<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>
<os><type>hvm</type></os></domain>"""


class Harness:
    """A driver plus the test-only ability to put a non-Kumo domain on its host."""

    def __init__(self, driver: HypervisorDriver) -> None:
        self.driver = driver
        self._foreign: list[str] = []

    def add_foreign_domain(self, name: str) -> None:
        if isinstance(self.driver, FakeDriver):
            self.driver.add_foreign_domain(name)
            return
        self.driver._conn.defineXML(FOREIGN_XML.format(name=name))
        self._foreign.append(name)

    def cleanup(self) -> None:
        if isinstance(self.driver, LibvirtDriver):
            # test:///default is shared by every connection in this process.
            for guest in self.driver.list_guests():
                self.driver.ensure_absent(guest.vm_id)
            for name in self._foreign:
                self.driver._conn.lookupByName(name).undefine()
            self.driver.close()


@pytest.fixture(params=["fake", "libvirt"])
def harness(request):
    if request.param == "fake":
        driver = FakeDriver()
    else:
        driver = LibvirtDriver("test:///default", poll_interval_s=0.001)
    h = Harness(driver)
    yield h
    h.cleanup()


@pytest.fixture
def driver(harness):
    return harness.driver


def new_vm_id() -> str:
    return str(uuid.uuid4())


def make_spec(vm_id: str | None = None, generation: int = 1, gpus=(), **overrides) -> GuestSpec:
    """A spec; ``gpus`` (host addresses) become GPU devices on the spec's NUMA cell, unless
    ``devices`` are given."""
    fields = {
        "vm_id": vm_id or new_vm_id(),
        "generation": generation,
        "name": "train-01",
        "vcpus": 4,
        "memory_mib": 2048,
        "numa_cell": None,
    }
    fields.update(overrides)
    fields.setdefault(
        "devices",
        tuple(
            PassthroughDevice(address=gpu, kind=DeviceKind.GPU, numa_node=fields["numa_cell"])
            for gpu in gpus
        ),
    )
    return GuestSpec(**fields)


class TestDriverContract:
    def test_reset_keeps_a_running_guest_running_and_leaves_a_stopped_one(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        assert driver.reset(spec.vm_id) == GuestState(spec.vm_id, 1, PowerState.SHUTOFF)
        driver.ensure_running(spec.vm_id)
        assert driver.reset(spec.vm_id) == GuestState(spec.vm_id, 1, PowerState.RUNNING)
        with pytest.raises(GuestNotFound):
            driver.reset(new_vm_id())

    def test_power_off_is_immediate_and_idempotent(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_running(spec.vm_id)
        assert driver.power_off(spec.vm_id) == GuestState(spec.vm_id, 1, PowerState.SHUTOFF)
        assert driver.power_off(spec.vm_id) == GuestState(spec.vm_id, 1, PowerState.SHUTOFF)
        assert [g.vm_id for g in driver.list_guests()] == [spec.vm_id]  # still defined
        with pytest.raises(GuestNotFound):
            driver.power_off(new_vm_id())

    def test_console_log_is_logged_to_the_given_file_and_read_as_a_tail(self, driver, tmp_path):
        log = tmp_path / "console.log"
        spec = make_spec(console_log=str(log))
        driver.ensure_defined(spec)
        assert driver.console_log(spec.vm_id) == b""  # nothing printed yet
        with pytest.raises(GuestNotFound):
            driver.console_log(new_vm_id())
        if isinstance(driver, LibvirtDriver):
            serial = ET.fromstring(driver.domain_xml(spec.vm_id)).find("devices/serial/log")
            assert (serial.get("file"), serial.get("append")) == (str(log), "on")
            log.write_bytes(b"old boot\n" * 10000 + b"login: ")  # what virtlogd appends
        else:
            driver.write_console(spec.vm_id, b"old boot\n" * 10000 + b"login: ")
        tail = driver.console_log(spec.vm_id, max_bytes=100)
        assert len(tail) == 100 and tail.endswith(b"\nlogin: ")
        assert len(driver.console_log(spec.vm_id)) == 65536

    def test_define_then_start(self, driver):
        spec = make_spec()
        assert driver.ensure_defined(spec) == GuestState(spec.vm_id, 1, PowerState.SHUTOFF)
        assert driver.ensure_running(spec.vm_id) == GuestState(spec.vm_id, 1, PowerState.RUNNING)
        assert driver.get_guest(spec.vm_id).power is PowerState.RUNNING

    def test_repeated_calls_are_idempotent(self, driver):
        spec = make_spec(gpus=(GPU_A,), nics=TAPS)
        driver.ensure_defined(spec)
        xml = driver.domain_xml(spec.vm_id)
        assert driver.ensure_defined(spec).generation == 1
        assert driver.domain_xml(spec.vm_id) == xml
        driver.ensure_running(spec.vm_id)
        assert driver.ensure_running(spec.vm_id).power is PowerState.RUNNING
        driver.ensure_stopped(spec.vm_id, graceful_timeout_s=1)
        state = driver.ensure_stopped(spec.vm_id, graceful_timeout_s=1)
        assert state == GuestState(spec.vm_id, 1, PowerState.SHUTOFF)
        assert [g.vm_id for g in driver.list_guests()] == [spec.vm_id]

    def test_same_generation_changes_nothing_even_if_spec_differs(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_defined(make_spec(spec.vm_id, generation=1, memory_mib=8192))
        memory = ET.fromstring(driver.domain_xml(spec.vm_id)).find("memory")
        assert (memory.get("unit"), memory.text) == ("KiB", str(2048 * 1024))

    def test_newer_generation_redefines_and_running_guest_keeps_running(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_running(spec.vm_id)
        state = driver.ensure_defined(make_spec(spec.vm_id, generation=2, gpus=(GPU_B,)))
        assert state == GuestState(spec.vm_id, 2, PowerState.RUNNING)
        xml = driver.domain_xml(spec.vm_id)
        assert parse_kumo_metadata(xml).generation == 2
        assert parse_hostdev_addresses(xml) == ["0000:af:00.1"]

    def test_older_generation_is_stale_and_ignored(self, driver):
        spec = make_spec(generation=3)
        driver.ensure_defined(spec)
        state = driver.ensure_defined(make_spec(spec.vm_id, generation=2, gpus=(GPU_A,)))
        assert state.generation == 3
        assert parse_hostdev_addresses(driver.domain_xml(spec.vm_id)) == []

    def test_stop_powers_off_and_keeps_definition(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_running(spec.vm_id)
        assert driver.ensure_stopped(spec.vm_id, graceful_timeout_s=5).power is PowerState.SHUTOFF
        assert driver.get_guest(spec.vm_id) == GuestState(spec.vm_id, 1, PowerState.SHUTOFF)

    def test_forced_stop_without_grace(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_running(spec.vm_id)
        assert driver.ensure_stopped(spec.vm_id, graceful_timeout_s=0).power is PowerState.SHUTOFF

    def test_operations_on_a_missing_guest_raise_guest_not_found(self, driver):
        vm_id = new_vm_id()
        with pytest.raises(GuestNotFound):
            driver.ensure_running(vm_id)
        with pytest.raises(GuestNotFound):
            driver.ensure_stopped(vm_id, graceful_timeout_s=0)
        with pytest.raises(GuestNotFound):
            driver.get_guest(vm_id)
        with pytest.raises(GuestNotFound):
            driver.domain_xml(vm_id)

    def test_absent_twice_is_fine(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_running(spec.vm_id)
        driver.ensure_absent(spec.vm_id)
        driver.ensure_absent(spec.vm_id)
        driver.ensure_absent(new_vm_id())  # never existed
        assert driver.list_guests() == []
        with pytest.raises(GuestNotFound):
            driver.get_guest(spec.vm_id)

    def test_list_shows_only_kumo_guests_with_generation(self, harness, driver):
        harness.add_foreign_domain(f"someone-else-{uuid.uuid4().hex[:8]}")
        first, second = make_spec(generation=4), make_spec(generation=1)
        driver.ensure_defined(first)
        driver.ensure_defined(second)
        driver.ensure_running(second.vm_id)
        expected = [
            GuestState(first.vm_id, 4, PowerState.SHUTOFF),
            GuestState(second.vm_id, 1, PowerState.RUNNING),
        ]
        assert driver.list_guests() == sorted(expected, key=lambda g: g.vm_id)

    def test_foreign_domain_with_a_kumo_name_is_never_touched(self, harness, driver):
        vm_id = new_vm_id()
        harness.add_foreign_domain(f"kumo-{vm_id}")
        with pytest.raises(DriverError):
            driver.ensure_defined(make_spec(vm_id))
        with pytest.raises(DriverError):
            driver.ensure_absent(vm_id)
        assert driver.list_guests() == []

    def test_xml_has_hostdevs_pinning_and_metadata(self, driver):
        spec = make_spec(generation=7, numa_cell=1, gpus=(GPU_A, GPU_B))
        driver.ensure_defined(spec)
        xml = driver.domain_xml(spec.vm_id)  # libvirt: read back with XMLDesc
        root = ET.fromstring(xml)
        assert root.findtext("name") == f"kumo-{spec.vm_id}"
        assert root.findtext("uuid") == domain_uuid(spec.vm_id)
        assert parse_hostdev_addresses(xml) == ["0000:3b:00.0", "0000:af:00.1"]
        hostdev = root.find("devices/hostdev")
        assert (hostdev.get("mode"), hostdev.get("managed")) == ("subsystem", "yes")
        guest = root.find(f"metadata/{{{KUMO_NS}}}guest")
        assert guest.findtext(f"{{{KUMO_NS}}}vm-id") == spec.vm_id
        assert guest.findtext(f"{{{KUMO_NS}}}generation") == "7"
        pins = root.findall("cputune/vcpupin")
        assert [p.get("cpuset") for p in pins] == ["8-15"] * spec.vcpus
        assert root.find("numatune/memory").get("nodeset") == "1"
        assert root.find("devices/graphics") is None

    def test_tap_nics_are_virtio_on_their_taps_in_order_and_the_guest_starts(self, driver):
        spec = make_spec(numa_cell=1, gpus=(GPU_A, GPU_B), nics=TAPS)
        driver.ensure_defined(spec)
        assert driver.ensure_running(spec.vm_id).power is PowerState.RUNNING
        root = ET.fromstring(driver.domain_xml(spec.vm_id))  # libvirt: read back with XMLDesc
        interfaces = root.findall("devices/interface")
        assert [i.get("type") for i in interfaces] == ["ethernet", "ethernet"]
        assert [i.find("mac").get("address") for i in interfaces] == [n.mac for n in TAPS]
        assert [i.find("target").attrib for i in interfaces] == [
            {"dev": n.device, "managed": "no"} for n in TAPS
        ]
        assert [i.find("model").get("type") for i in interfaces] == ["virtio", "virtio"]
        assert [i.find("mtu").get("size") for i in interfaces] == ["1450", "9000"]
        ports = {int(c.get("index")): c.get("model") for c in root.findall("devices/controller")}
        buses = [int(i.find("address").get("bus"), 16) for i in interfaces]
        assert [ports[bus] for bus in buses] == ["pcie-root-port"] * 2
        hostdev_buses = {int(a.get("bus"), 16) for a in root.findall("devices/hostdev/address")}
        assert len(set(buses) | hostdev_buses) == 4  # every device alone behind its own port

    def test_a_vf_nic_adds_no_device_of_its_own(self, driver):
        spec = make_spec(
            devices=(PassthroughDevice(address=VF, kind=DeviceKind.RDMA_VF, numa_node=0),),
            nics=(GuestNic(mac="52:54:00:0b:00:01", mtu=1500, kind=NicKind.VF, pci_address=VF),),
        )
        driver.ensure_defined(spec)
        xml = driver.domain_xml(spec.vm_id)
        assert parse_hostdev_addresses(xml) == [str(VF)]
        assert ET.fromstring(xml).find("devices/interface") is None

    def test_unknown_numa_cell_is_a_driver_error(self, driver):
        spec = make_spec(numa_cell=9)
        with pytest.raises(DriverError):
            driver.ensure_defined(spec)
        assert driver.list_guests() == []


# -- fake-only: failure injection and host accounting -----------------------------------------


def test_fake_injected_failure_changes_nothing_and_retry_succeeds():
    driver = FakeDriver()
    spec = make_spec()
    driver.ensure_defined(spec)
    driver.fail_next("ensure_running", GuestNotFound("boom"))
    driver.fail_next("ensure_running")
    with pytest.raises(GuestNotFound, match="boom"):
        driver.ensure_running(spec.vm_id)
    with pytest.raises(DriverError, match="injected"):
        driver.ensure_running(spec.vm_id)
    assert driver.get_guest(spec.vm_id).power is PowerState.SHUTOFF
    assert driver.ensure_running(spec.vm_id).power is PowerState.RUNNING
    with pytest.raises(ValueError):
        driver.fail_next("no_such_method")


def test_fake_gpu_is_held_by_one_running_guest_at_a_time():
    driver = FakeDriver()
    first, second = make_spec(gpus=(GPU_A,)), make_spec(gpus=(GPU_A, GPU_B))
    driver.ensure_defined(first)
    driver.ensure_defined(second)
    driver.ensure_running(first.vm_id)
    with pytest.raises(DriverError, match=r"0000:3b:00\.0"):
        driver.ensure_running(second.vm_id)
    driver.ensure_stopped(first.vm_id, graceful_timeout_s=0)
    assert driver.ensure_running(second.vm_id).power is PowerState.RUNNING


def test_fake_crashed_guest_is_restarted_by_ensure_running():
    driver = FakeDriver()
    spec = make_spec()
    driver.ensure_defined(spec)
    driver.ensure_running(spec.vm_id)
    driver.set_power(spec.vm_id, PowerState.CRASHED)
    assert driver.list_guests()[0].power is PowerState.CRASHED
    assert driver.ensure_running(spec.vm_id).power is PowerState.RUNNING


# -- the value types ----------------------------------------------------------------------------


def test_pci_address_round_trip_and_validation():
    assert str(PciAddress.parse("0000:3B:00.0")) == "0000:3b:00.0"
    assert PciAddress.parse("af:00.1") == PciAddress(0, 0xAF, 0, 1)
    for bad in ("0000:3b:00.8", "3b:00", "0000:3b:20.0", "pci_0000_3b_00_0"):
        with pytest.raises(ValueError):
            PciAddress.parse(bad)


def test_guest_spec_rejects_unsafe_vm_ids_and_duplicate_gpus():
    with pytest.raises(ValueError):
        make_spec("../etc")
    with pytest.raises(ValueError):
        make_spec(gpus=(GPU_A, GPU_A))


def test_numa_cell_without_cell_cpus_is_refused_by_the_builder():
    with pytest.raises(ValueError):
        build_domain_xml(make_spec(numa_cell=0))


def test_guest_cpu_mode_and_hidden_features_are_in_the_xml():
    xml = build_domain_xml(
        make_spec(), cpu_mode="host-model", cpu_disable=("arch-capabilities",), machine="q35"
    )
    cpu = ET.fromstring(xml).find("cpu")
    assert cpu.get("mode") == "host-model"
    assert [(f.get("policy"), f.get("name")) for f in cpu.findall("feature")] == [
        ("disable", "arch-capabilities")
    ]
    assert ET.fromstring(build_domain_xml(make_spec())).find("cpu").get("mode") == (
        "host-passthrough"
    )


def test_nics_never_move_passthrough_devices_nor_change_the_nccl_topology():
    devices = (
        PassthroughDevice(address=GPU_A, kind=DeviceKind.GPU, numa_node=0),
        PassthroughDevice(address=VF, kind=DeviceKind.RDMA_VF, numa_node=0),
        PassthroughDevice(address=GPU_B, kind=DeviceKind.GPU, numa_node=1),
    )
    vf_nic = GuestNic(mac="52:54:00:0b:00:01", mtu=1500, kind=NicKind.VF, pci_address=VF)
    bare = make_spec("v1", devices=devices)
    with_nics = make_spec("v1", devices=devices, nics=(*TAPS, vf_nic))

    def pci(spec) -> set[bytes]:
        """Controllers and hostdevs, less the free hot-plug root ports (the last ones,
        numbered after the NICs' ports)."""
        root = ET.fromstring(build_domain_xml(spec, cells={0: [0, 1], 1: [2, 3]}))
        elements = [e for e in root.find("devices") if e.tag in ("controller", "hostdev")]
        return {ET.tostring(e) for e in elements[: len(elements) - HOTPLUG_PORTS]}

    added = [ET.fromstring(e) for e in pci(with_nics) - pci(bare)]
    assert pci(bare) <= pci(with_nics)  # every controller and hostdev as it was
    assert sorted((e.get("model"), int(e.get("index"))) for e in added) == [
        ("pcie-root-port", 6),  # pcie-root, 2 expanders, 3 device ports, then the NICs'
        ("pcie-root-port", 7),
    ]
    assert nccl.topology_xml(with_nics) == nccl.topology_xml(bare)


def test_a_real_guest_keeps_free_root_ports_for_hot_plug_a_simulated_one_none():
    def ports(domain_type):
        root = ET.fromstring(build_domain_xml(make_spec(nics=TAPS), domain_type=domain_type))
        return [
            int(c.get("index"))
            for c in root.iterfind("devices/controller")
            if c.get("model") == "pcie-root-port"
        ]

    assert ports("kvm") == list(range(1, 3 + HOTPLUG_PORTS))  # the 2 NICs', then the free
    assert ports("test") == [1, 2]


def test_guest_nic_and_spec_validation():
    tap = TAPS[0]
    for bad in (
        {"mac": "52:54:00:0A:00:01"},  # upper case would not read back as written
        {"mtu": 67},
        {"device": ""},
        {"device": "a-name-longer-than-15"},
        {"addresses": ("192.168.10.11/33",)},
        {"gateway": "192.168.10"},
        {"dns": ("not-an-address",)},
        {"kind": NicKind.VF},  # without its pci_address
    ):
        with pytest.raises(ValueError):
            replace(tap, **bad)
    with pytest.raises(ValueError, match="twice"):
        make_spec(nics=(tap, GuestNic(mac=tap.mac, mtu=1500, device="tp-other")))
    with pytest.raises(ValueError, match="twice"):
        make_spec(nics=(tap, GuestNic(mac="52:54:00:0a:00:09", mtu=1500, device=tap.device)))
    with pytest.raises(ValueError, match="not a passed-through VF"):
        make_spec(nics=(GuestNic(mac=tap.mac, mtu=1500, kind=NicKind.VF, pci_address=VF),))
    with pytest.raises(ValueError, match="q35"):
        build_domain_xml(make_spec(nics=TAPS), machine="pc")


def test_console_tail_reads_across_virtlogds_rotation(tmp_path):
    from compute.drivers.libvirt import read_tail

    (tmp_path / "c.log.0").write_bytes(b"A" * 50 + b"B" * 50)
    (tmp_path / "c.log").write_bytes(b"C" * 30)
    paths = [str(tmp_path / "c.log.0"), str(tmp_path / "c.log")]
    assert read_tail(paths, 40) == b"B" * 10 + b"C" * 30
    assert read_tail(paths, 20) == b"C" * 20
    assert read_tail([str(tmp_path / "gone.0"), str(tmp_path / "gone")], 10) == b""


# -- volumes, live (the real hypervisor's half: tests/compute/test_live_volumes.py) -------------

VOLUME = DiskSpec(
    source="vol-0a1b", pool="kumo-local", target_dev="vdb", format="raw", serial="0a1b2c3d4e5f"
)


class TestLiveVolumesContract:
    def test_attach_to_a_running_guest_and_repeat(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_running(spec.vm_id)
        driver.ensure_disk_attached(spec.vm_id, VOLUME)
        assert driver.volume_disks(spec.vm_id) == {"vdb": ("kumo-local", "vol-0a1b", VOLUME.serial)}
        defined = ET.fromstring(driver.domain_xml(spec.vm_id))
        [disk] = [d for d in defined.iterfind("devices/disk") if d.get("type") == "volume"]
        assert disk.findtext("serial") == VOLUME.serial
        assert disk.find("target").get("dev") == "vdb"
        xml = driver.domain_xml(spec.vm_id)
        driver.ensure_disk_attached(spec.vm_id, VOLUME)
        assert driver.domain_xml(spec.vm_id) == xml
        assert driver.get_guest(spec.vm_id).power is PowerState.RUNNING

    def test_attach_to_a_stopped_guest_is_in_its_definition(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_disk_attached(spec.vm_id, VOLUME)
        assert "vdb" in driver.volume_disks(spec.vm_id)
        assert driver.ensure_disk_size(spec.vm_id, "vdb", 1 << 30) == 0  # nothing runs
        driver.ensure_running(spec.vm_id)
        assert "vdb" in driver.volume_disks(spec.vm_id)

    def test_detach_and_detach_of_a_missing_disk(self, driver):
        spec = make_spec()
        driver.ensure_defined(spec)
        driver.ensure_running(spec.vm_id)
        driver.ensure_disk_attached(spec.vm_id, VOLUME)
        driver.ensure_disk_detached(spec.vm_id, "vdb")
        assert driver.volume_disks(spec.vm_id) == {}
        assert "vol-0a1b" not in driver.domain_xml(spec.vm_id)
        driver.ensure_disk_detached(spec.vm_id, "vdb")
        driver.ensure_disk_detached(spec.vm_id, "vdz")
        assert driver.get_guest(spec.vm_id).power is PowerState.RUNNING

    def test_a_missing_guest_is_guest_not_found(self, driver):
        vm_id = new_vm_id()
        for call in (
            lambda: driver.volume_disks(vm_id),
            lambda: driver.ensure_disk_attached(vm_id, VOLUME),
            lambda: driver.ensure_disk_detached(vm_id, "vdb"),
            lambda: driver.ensure_disk_size(vm_id, "vdb", 1),
        ):
            with pytest.raises(GuestNotFound):
                call()


def test_the_fake_grows_a_live_disk_and_never_shrinks_it():
    fake = FakeDriver()
    spec = make_spec()
    fake.ensure_defined(spec)
    fake.ensure_running(spec.vm_id)
    fake.ensure_disk_attached(spec.vm_id, replace(VOLUME, size_bytes=1 << 30))
    assert fake.ensure_disk_size(spec.vm_id, "vdb", 2 << 30) == 2 << 30
    assert fake.ensure_disk_size(spec.vm_id, "vdb", 1 << 30) == 2 << 30
    with pytest.raises(DriverError):
        fake.ensure_disk_size(spec.vm_id, "vdc", 1)
