"""The portal's images page: what it lists, deleting one's own (409 in use as a message),
and the upload as the page's script does it: a JSON POST and a raw PUT of the file to the
API with the session and the CSRF token."""

import hashlib

import pytest
from django.urls import reverse

from compute import services
from compute.choices import ImageState
from compute.models import Image
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


def test_upload_as_the_page_script_does_it(login, project, cloud):
    client = login(project.owner, csrf=True)
    page = client.get(reverse("portal:images", kwargs={"slug": project.slug}))
    token = page.cookies["csrftoken"].value
    api = f"/api/v1/projects/{project.slug}/images/"
    created = client.post(
        api,
        {"name": "browser", "os_distro": "debian", "format": "raw", "login_user": "debian"},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )
    assert created.status_code == 201, created.content
    data = b"\x01\x02" * 100_000
    no_csrf = client.put(
        f"{api}{created.json()['id']}/file/", data, content_type="application/octet-stream"
    )
    assert no_csrf.status_code == 403
    uploaded = client.put(
        f"{api}{created.json()['id']}/file/",
        data,
        content_type="application/octet-stream",
        HTTP_X_CSRFTOKEN=token,
    )
    assert uploaded.status_code == 200, uploaded.content
    assert uploaded.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()


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
