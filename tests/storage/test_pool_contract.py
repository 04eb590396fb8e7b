"""The ``PoolDriver`` contract, run against the in-memory fake and against libvirt's test
driver (``storage.drivers.pools`` on a ``test:///default`` connection: the same calls a
real host makes on ``qemu:///system``)."""

import uuid

import libvirt
import pytest

from storage.drivers.base import GIB, PoolSpec, StorageError, VolumeSpec
from storage.drivers.fake import FakePoolDriver
from storage.drivers.pools import LibvirtPoolDriver, pool_xml


@pytest.fixture(params=["fake", "libvirt-test"])
def driver(request):
    if request.param == "fake":
        yield FakePoolDriver()
        return
    conn = libvirt.open("test:///default")
    yield LibvirtPoolDriver(conn, simulated=True)
    conn.close()


@pytest.fixture
def pool(driver):
    spec = PoolSpec(name=f"p-{uuid.uuid4().hex[:8]}", kind="dir", target="/kumo/test-pool")
    driver.ensure_pool(spec)
    return spec


def test_ensure_pool_twice_is_harmless(driver, pool):
    driver.ensure_pool(pool)
    assert driver.list_volumes(pool.name) == []


def test_volume_is_made_at_its_capacity(driver, pool):
    info = driver.ensure_volume(VolumeSpec(pool=pool.name, name="vol-a", capacity_gib=10))
    assert info.capacity_bytes == 10 * GIB
    assert [v.name for v in driver.list_volumes(pool.name)] == ["vol-a"]


def test_repeat_changes_nothing_and_a_larger_request_grows_it(driver, pool):
    spec = VolumeSpec(pool=pool.name, name="vol-a", capacity_gib=10)
    driver.ensure_volume(spec)
    assert driver.ensure_volume(spec).capacity_bytes == 10 * GIB
    grown = driver.ensure_volume(VolumeSpec(pool=pool.name, name="vol-a", capacity_gib=25))
    assert grown.capacity_bytes == 25 * GIB
    assert len(driver.list_volumes(pool.name)) == 1


def test_a_smaller_request_never_shrinks(driver, pool):
    driver.ensure_volume(VolumeSpec(pool=pool.name, name="vol-a", capacity_gib=20))
    info = driver.ensure_volume(VolumeSpec(pool=pool.name, name="vol-a", capacity_gib=5))
    assert info.capacity_bytes == 20 * GIB


def test_absent_deletes_only_that_volume_and_repeats_harmlessly(driver, pool):
    driver.ensure_volume(VolumeSpec(pool=pool.name, name="vol-a", capacity_gib=1))
    driver.ensure_volume(VolumeSpec(pool=pool.name, name="vol-b", capacity_gib=1))
    driver.ensure_volume_absent(pool.name, "vol-a")
    driver.ensure_volume_absent(pool.name, "vol-a")
    driver.ensure_volume_absent("no-such-pool", "vol-a")
    assert [v.name for v in driver.list_volumes(pool.name)] == ["vol-b"]


def test_a_volume_in_an_undefined_pool_is_a_storage_error(driver):
    with pytest.raises(StorageError, match="not defined"):
        driver.ensure_volume(VolumeSpec(pool="nowhere", name="vol-a", capacity_gib=1))


def test_names_are_validated():
    with pytest.raises(ValueError):
        VolumeSpec(pool="p", name="../etc", capacity_gib=1)
    with pytest.raises(ValueError):
        VolumeSpec(pool="p", name="v", capacity_gib=0)
    with pytest.raises(ValueError):
        PoolSpec(name="vg", kind="logical")


def test_logical_pool_xml_names_its_volume_group():
    xml = pool_xml(PoolSpec(name="kumo-local", kind="logical", source="vg_nvme"))
    assert '<source><name>vg_nvme</name><format type="lvm2" /></source>' in xml
    assert "<path>/dev/vg_nvme</path>" in xml
