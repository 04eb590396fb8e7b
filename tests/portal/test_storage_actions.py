"""The storage page's actions: a volume attached to a VM, detached and extended through
``storage.services`` (audited), bad input a 400 naming the field, the service's refusal
on the form; shares with their mount command, buckets with their S3 endpoint, and S3
access keys made (the secret shown once) and deleted by admins only."""

import pytest
from django.urls import reverse

from compute.choices import VmState
from compute.models import VirtualMachine
from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from storage import services
from storage.choices import VolumeState
from storage.drivers.fake import FakeObjectStore
from storage.models import AccessKey, Share, Volume
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_host, make_vm

pytestmark = pytest.mark.django_db


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


@pytest.fixture(autouse=True)
def backends(monkeypatch, settings, db):
    store = FakeObjectStore()
    monkeypatch.setattr(services, "object_store", lambda: store)
    settings.SHARE_TIERS = {"fast": {"backend": "lustre", "host": "mds-01", "source": "m:/fast"}}
    settings.OBJECT_STORE = {**settings.OBJECT_STORE, "endpoint": "https://s3.example.org"}
    make_host("mds-01", kind="cpu")
    return store


@pytest.fixture
def volume(project, cloud):
    Quota.objects.filter(project=project).update(storage_gib=10_000, buckets=10)
    return services.volume_create(project=project, name="scratch", size_gib=10)


@pytest.fixture
def vm(project, cloud):
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], name="train-1")
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    return VirtualMachine.objects.get(pk=vm.pk)


def errors_of(response, field):
    import re

    html = response.content.decode()
    found = re.search(rf'<ul class="errorlist" role="alert" data-field="{field}">(.*?)</ul>', html)
    return found.group(1) if found else ""


def test_attach_detach_and_extend_are_the_services_and_audited(login, project, cloud, volume, vm):
    member = cloud["users"][Role.MEMBER]
    client = login(member)
    page = client.post(url("volume-attach", project, pk=volume.pk), {"vm": vm.pk}, follow=True)
    assert f"Volume scratch attached to VM {vm.name}." in page.content.decode()
    volume.refresh_from_db()
    assert volume.vm_id == vm.pk and volume.state == VolumeState.IN_USE
    assert f"virtio-{volume.serial}" in page.content.decode()
    client.post(url("volume-extend", project, pk=volume.pk), {"size_gib": "20"})
    client.post(url("volume-detach", project, pk=volume.pk))
    volume.refresh_from_db()
    assert volume.size_gib == 20 and volume.vm_id is None
    trail = AuditEvent.objects.for_project(project).filter(object_id=str(volume.pk))
    assert {"volume.attach", "volume.extend", "volume.detach"} <= set(
        trail.values_list("action", flat=True)
    )
    assert trail.get(action="volume.attach").actor == member


@pytest.mark.parametrize(
    ("name", "data", "field", "says"),
    [
        ("volume-attach", {"vm": "00000000-0000-4000-8000-000000000000"}, "vm", "valid choice"),
        ("volume-attach", {}, "vm", "required"),
        ("volume-extend", {"size_gib": "many"}, "size_gib", "whole number"),
        ("volume-extend", {"size_gib": "0"}, "size_gib", "greater than or equal to 1"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    login, project, cloud, volume, name, data, field, says
):
    response = login(project.owner).post(url(name, project, pk=volume.pk), data)
    assert response.status_code == 400
    assert says in errors_of(response, field)


def test_another_projects_vm_is_no_choice(login, project, other_project, cloud, volume):
    from tenants import services as tenants

    tenants.quota_set(project=other_project, vcpus=64, memory_gib=256, gpus=0, vms=8)
    theirs = make_vm(other_project, template=cloud["cpu"], image=cloud["image"])
    response = login(project.owner).post(
        url("volume-attach", project, pk=volume.pk), {"vm": theirs.pk}
    )
    assert response.status_code == 400
    assert "valid choice" in errors_of(response, "vm")
    assert Volume.objects.get(pk=volume.pk).vm_id is None


def test_the_services_refusal_lands_on_the_form(login, project, cloud, volume, vm):
    client = login(project.owner)
    shrink = client.post(url("volume-extend", project, pk=volume.pk), {"size_gib": "5"})
    assert shrink.status_code == 400
    assert "must be larger than the volume" in errors_of(shrink, "size_gib")
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.PENDING, host=None)
    pending = client.post(url("volume-attach", project, pk=volume.pk), {"vm": vm.pk})
    assert pending.status_code == 409
    assert "volumes attach to placed VMs" in errors_of(pending, "vm")
    detach = client.post(url("volume-detach", project, pk=volume.pk), follow=True)
    assert "volume scratch is available" in detach.content.decode()


def test_a_reader_may_not_attach(login, project, cloud, volume, vm):
    reader = cloud["users"][Role.READER]
    response = login(reader).post(url("volume-attach", project, pk=volume.pk), {"vm": vm.pk})
    assert response.status_code == 403
    assert Volume.objects.get(pk=volume.pk).vm_id is None
    assert AuditEvent.objects.for_project(project).get(outcome=AuditOutcome.DENIED).actor == reader


def test_shares_show_their_mount_command_and_buckets_their_endpoint(login, project, cloud, volume):
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=10)
    Share.objects.filter(pk=share.pk).update(applied_generation=share.generation)
    services.bucket_create(project=project, name="genome-raw", quota_gib=5)
    html = login(cloud["users"][Role.READER]).get(url("storage", project)).content.decode()
    assert f"mount -t lustre {share.mount_source} {share.mount_point}" in html
    assert '<code class="endpoint">https://s3.example.org</code>' in html


def test_an_access_key_is_shown_once_and_deleted_by_admins(login, project, cloud, backends):
    client = login(cloud["users"][Role.ADMIN])
    made = client.post(url("access-key-create", project), {"description": "ci"})
    assert made.status_code == 200
    key = AccessKey.objects.for_project(project).get()
    html = made.content.decode()
    assert 'id="access-key-secret"' in html and key.access_key_id in html
    again = client.get(url("storage", project)).content.decode()
    assert key.access_key_id in again and 'id="access-key-secret"' not in again
    assert AuditEvent.objects.for_project(project).filter(action="accesskey.create").exists()
    client.post(url("access-key-delete", project, pk=key.pk))
    assert not AccessKey.objects.filter(pk=key.pk).exists()
    assert AuditEvent.objects.for_project(project).filter(action="accesskey.delete").exists()


def test_a_member_may_not_make_or_delete_access_keys(login, project, cloud):
    key, _secret = services.access_key_create(project=project)
    client = login(cloud["users"][Role.MEMBER])
    page = client.get(url("storage", project)).content.decode()
    assert 'id="access-key-create"' not in page
    assert client.post(url("access-key-create", project), {"description": "x"}).status_code == 403
    assert client.post(url("access-key-delete", project, pk=key.pk)).status_code == 403
    assert AccessKey.objects.for_project(project).count() == 1


def test_a_too_long_description_is_a_400(login, project, cloud):
    response = login(project.owner).post(
        url("access-key-create", project), {"description": "x" * 300}
    )
    assert response.status_code == 400
    assert "at most 200 characters" in errors_of(response, "description")
    assert not AccessKey.objects.for_project(project).exists()
