"""Volumes through the services, and the acceptance test: a volume created and attached
through Kumo reaches a VM on a test-driver host, where the disk is found in the domain
XML read back from libvirt, in the host's pool at its size; detaching takes it out again
and keeps the data's volume."""

import xml.etree.ElementTree as ET

import pytest

from compute import host_tasks
from compute.drivers import simnode
from compute.drivers.libvirt import LibvirtDriver
from compute.protocol import VmApply
from compute.services.lifecycle import apply_message
from controlplane.agent import runtime
from controlplane.agent.config import AgentConfig
from controlplane.errors import Conflict, InvalidInput, QuotaExceeded
from storage import services
from storage.drivers.base import GIB
from storage.host_tasks import pool_driver
from storage.models import StorageUsage, Volume
from tenants.models import Quota
from tests.factories import make_host, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture
def host(db):
    return make_host("gpu-01")


@pytest.fixture
def vm(project, host):
    vm = make_vm(project)
    assert vm.host_id == host.pk
    return vm


@pytest.fixture
def hv(tmp_path):
    runtime.configure(AgentConfig.from_env(host="gpu-01", instances_dir=tmp_path / "instances"))
    fleet = simnode.write_fleet(tmp_path / "fleet", 1, 0)
    driver = LibvirtDriver(f"test://{fleet['gpu-01']}", poll_interval_s=0.001)
    yield driver
    driver.close()
    runtime.configure(None)


def _on_host(vm, hv) -> ET.Element:
    """Send the VM's current ``vm_apply`` over the wire to the agent code and read the
    domain back from libvirt."""
    vm.refresh_from_db()
    message = VmApply.from_wire(apply_message(vm).to_wire())
    host_tasks.apply(message, hv)
    return ET.fromstring(hv.domain_xml(str(vm.pk)))


def _volume_disks(domain: ET.Element) -> list[ET.Element]:
    return domain.findall("devices/disk[@type='volume']")


def test_an_attached_volume_is_a_disk_of_the_guest_on_a_test_driver_host(project, vm, hv):
    volume = services.volume_create(project=project, name="scratch", size_gib=50)
    assert _volume_disks(_on_host(vm, hv)) == []

    volume = services.volume_attach(volume=volume, vm=vm)
    assert (volume.state, volume.device) == ("in_use", "vdb")
    domain = _on_host(vm, hv)
    (disk,) = _volume_disks(domain)
    assert disk.find("source").attrib == {"pool": "kumo-shared", "volume": volume.volume_name}
    assert disk.find("target").get("dev") == "vdb"
    assert disk.find("serial").text == volume.serial
    assert domain.find("devices/disk[@type='file']/target").get("dev") == "vda"  # the root disk
    (made,) = pool_driver(hv).list_volumes("kumo-shared")
    assert (made.name, made.capacity_bytes) == (volume.volume_name, 50 * GIB)

    services.volume_extend(volume=volume, size_gib=80)
    _on_host(vm, hv)
    assert pool_driver(hv).list_volumes("kumo-shared")[0].capacity_bytes == 80 * GIB

    services.volume_detach(volume=volume)
    assert _volume_disks(_on_host(vm, hv)) == []
    assert [v.name for v in pool_driver(hv).list_volumes("kumo-shared")] == [volume.volume_name]


def test_attach_bumps_the_vms_generation_and_picks_the_next_device(project, vm):
    generation = vm.generation
    first = services.volume_attach(
        volume=services.volume_create(project=project, name="a", size_gib=1), vm=vm
    )
    second = services.volume_attach(
        volume=services.volume_create(project=project, name="b", size_gib=1), vm=vm
    )
    vm.refresh_from_db()
    assert (first.device, second.device) == ("vdb", "vdc")
    assert vm.generation == generation + 2
    assert [v.device for v in apply_message(vm).volumes] == ["vdb", "vdc"]


def test_an_attached_volume_cannot_be_attached_again_or_deleted(project, vm):
    volume = services.volume_attach(
        volume=services.volume_create(project=project, name="a", size_gib=1), vm=vm
    )
    with pytest.raises(Conflict, match="in_use"):
        services.volume_attach(volume=volume, vm=vm)
    with pytest.raises(Conflict) as refused:
        services.volume_delete(volume=volume)
    assert refused.value.code == "in_use"
    services.volume_detach(volume=volume)
    with pytest.raises(Conflict, match="available"):
        services.volume_detach(volume=volume)
    services.volume_delete(volume=volume)
    assert not Volume.objects.filter(pk=volume.pk).exists()


def test_a_local_volume_stays_on_its_host(project, vm):
    volume = services.volume_create(project=project, name="nvme", size_gib=1, tier="local")
    services.volume_attach(volume=volume, vm=vm)
    services.volume_detach(volume=volume)
    make_host("gpu-02")
    elsewhere = make_vm(project)
    elsewhere.host = make_host("gpu-02")
    elsewhere.save(update_fields=["host"])
    with pytest.raises(Conflict) as refused:
        services.volume_attach(volume=volume, vm=elsewhere)
    assert refused.value.code == "wrong_host"


def test_a_pending_vm_takes_no_volume(project, vm):
    vm.host = None
    vm.state = "pending"
    vm.save(update_fields=["host", "state"])
    volume = services.volume_create(project=project, name="a", size_gib=1)
    with pytest.raises(Conflict, match="pending"):
        services.volume_attach(volume=volume, vm=vm)


def test_deleting_the_vm_detaches_its_volumes(project, vm):
    from compute import services as compute

    volume = services.volume_attach(
        volume=services.volume_create(project=project, name="a", size_gib=1), vm=vm
    )
    vm.refresh_from_db()  # the attach bumped its generation
    compute.vm_delete(vm=vm)
    volume.refresh_from_db()
    assert (volume.state, volume.vm_id, volume.device) == ("available", None, "")


def test_the_storage_quota_counts_volumes_and_growth(project):
    Quota.objects.filter(project=project).update(storage_gib=100)
    volume = services.volume_create(project=project, name="a", size_gib=60)
    with pytest.raises(QuotaExceeded):
        services.volume_create(project=project, name="b", size_gib=41)
    with pytest.raises(QuotaExceeded):
        services.volume_extend(volume=volume, size_gib=101)
    with pytest.raises(InvalidInput) as smaller:
        services.volume_extend(volume=volume, size_gib=60)
    assert smaller.value.details == {"size_gib": ["must be larger than the volume's 60 GiB"]}
    services.volume_extend(volume=volume, size_gib=100)


def test_usage_intervals_follow_the_size(project):
    volume = services.volume_create(project=project, name="a", size_gib=10)
    services.volume_extend(volume=volume, size_gib=20)
    services.volume_delete(volume=volume)
    rows = list(StorageUsage.objects.for_project(project).order_by("started_at"))
    assert [(r.gib, r.ended_at is not None) for r in rows] == [(10, True), (20, True)]
    assert rows[0].ended_at == rows[1].started_at


def test_a_volume_is_billed_by_its_size_from_creation_to_deletion(project):
    from tenants.choices import UsageResource
    from tenants.models import UsageRecord

    volume = services.volume_create(project=project, name="billed", size_gib=10)
    services.volume_extend(volume=volume, size_gib=30)
    services.volume_delete(volume=Volume.objects.get(pk=volume.pk))
    records = UsageRecord.objects.filter(project=project, resource=UsageResource.STORAGE).order_by(
        "started_at"
    )
    assert [r.quantity for r in records] == [10, 30]
    assert all(r.ended_at is not None for r in records)
    assert records[0].ended_at == records[1].started_at
