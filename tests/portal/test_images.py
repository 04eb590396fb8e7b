"""The portal's images page: what it lists, deleting one's own (409 in use as a message),
and the upload form: the record registered and the file streamed into the image store by
the API's service (audited), bad input a 400 naming the field."""

import hashlib
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from compute import services
from compute.choices import ImageState
from compute.models import Image
from controlplane.models import AuditEvent
from tenants.choices import Role
from tests.factories import make_image, make_project, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store(settings, tmp_path):
    settings.IMAGE_STORE = {"kind": "dir", "dir": str(tmp_path / "store"), "bucket": ""}


def test_the_page_lists_public_and_own_images_only(login, project, cloud):
    mine = make_image(project=project, name="mine-img", login_user="rocky")
    theirs = make_image(project=make_project(), name="theirs-img")
    page = login(project.owner).get(reverse("portal:images", kwargs={"slug": project.slug}))
    assert page.status_code == 200
    body = page.content.decode()
    assert mine.name in body and cloud["image"].name in body and "rocky" in body
    assert theirs.name not in body
    assert 'id="image-upload"' in body


def test_a_reader_gets_no_upload_form(login, project, cloud):
    reader = cloud["users"][Role.READER]
    page = login(reader).get(reverse("portal:images", kwargs={"slug": project.slug}))
    assert 'id="image-upload"' not in page.content.decode()


def _file(data=b"\x01\x02" * 100_000, name="disk.raw"):
    return SimpleUploadedFile(name, data, content_type="application/octet-stream")


def _upload(client, project, **fields):
    data = {"name": "uploaded", "os_distro": "debian", "format": "raw", "login_user": "debian"}
    data.update(fields)
    data.setdefault("file", _file())
    return client.post(reverse("portal:images", kwargs={"slug": project.slug}), data)


def test_an_upload_streams_the_file_into_the_store_and_is_audited(login, project, cloud):
    member = cloud["users"][Role.MEMBER]
    response = _upload(login(member), project)
    assert response.status_code == 302, response.content[:2000]
    image = Image.objects.get(project=project, name="uploaded")
    assert image.state == ImageState.ACTIVE and image.login_user == "debian"
    assert image.checksum == "sha256:" + hashlib.sha256(b"\x01\x02" * 100_000).hexdigest()
    assert image.size_bytes == 200_000
    event = AuditEvent.objects.for_project(project).get(action="image.upload")
    assert event.actor == member and event.source == "portal"


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"file": ""}, "file", "required"),
        ({"file": _file(b"")}, "file", "empty"),
        ({"format": "vmdk"}, "format", "valid choice"),
        ({"name": ""}, "name", "required"),
        ({"login_user": "root!"}, "login_user", "must be a user name"),
    ],
)
def test_bad_upload_input_is_a_400_naming_the_field(login, project, cloud, fields, field, says):
    response = _upload(login(project.owner), project, **fields)
    assert response.status_code == 400
    html = response.content.decode()
    found = re.search(rf'data-field="{field}">(.*?)</ul>', html)
    assert found and says in found.group(1), html[:3000]


def test_an_image_over_the_limit_fails_with_the_reason(login, project, cloud, settings):
    settings.IMAGE_MAX_BYTES = 1000
    response = _upload(login(project.owner), project, file=_file(b"x" * 5000))
    assert response.status_code == 413
    assert "larger than 1000 bytes" in response.content.decode()
    assert Image.objects.get(project=project, name="uploaded").state == ImageState.FAILED


def test_a_reader_may_not_upload(login, project, cloud):
    reader = cloud["users"][Role.READER]
    assert _upload(login(reader), project).status_code == 403
    assert not Image.objects.filter(project=project).exists()


def test_delete_own_image_and_in_use_refusal_as_a_message(
    login, project, cloud, tmp_path, django_capture_on_commit_callbacks
):
    source = tmp_path / "img"
    source.write_bytes(b"x" * 1000)
    image = services.image_import(
        source_path=source,
        name="deletable",
        disk_format="raw",
        os_distro="debian",
        visibility="project",
        project=project,
    )
    vm = make_vm(project, image=image, name="holder")
    client = login(project.owner)
    url = reverse("portal:image-delete", kwargs={"slug": project.slug, "pk": image.pk})
    refused = client.post(url, follow=True)
    assert "holder" in refused.content.decode()
    assert Image.objects.get(pk=image.pk).state == ImageState.ACTIVE
    vm.delete()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url)
    assert Image.objects.get(pk=image.pk).state == ImageState.DELETED
    public = cloud["image"]
    other = reverse("portal:image-delete", kwargs={"slug": project.slug, "pk": public.pk})
    assert client.post(other).status_code == 404  # not the project's to delete
