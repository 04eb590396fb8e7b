"""Images as a service: registering, the streamed upload, states, checksums, deletion while
in use, isolation of the upload, ``image_import``, and what a host is told to fetch."""

import hashlib
from pathlib import Path

import pytest

from compute import services
from compute.choices import ImageState, VmState
from compute.models import Image, VirtualMachine
from compute.services.images import image_store
from compute.services.lifecycle import apply_message
from controlplane.models import AuditEvent
from tenants.choices import Role
from tests.factories import add_member, make_vm

pytestmark = pytest.mark.django_db

DATA = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and a bit: more than one chunk
SHA = "sha256:" + hashlib.sha256(DATA).hexdigest()


@pytest.fixture(autouse=True)
def store_dir(settings, tmp_path):
    root = tmp_path / "image-store"
    settings.IMAGE_STORE = {"kind": "dir", "dir": str(root), "bucket": ""}
    settings.IMAGE_FETCH_BASE_URL = ""
    return root


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _register(api, project, **fields):
    payload = {"name": "deb", "os_distro": "debian", "os_version": "12", "format": "qcow2"}
    return api.post(
        f"/api/v1/projects/{project.slug}/images/", {**payload, **fields}, format="json"
    )


def _put(api, project, image_id, data: bytes):
    return api.put(
        f"/api/v1/projects/{project.slug}/images/{image_id}/file/",
        data=data,
        content_type="application/octet-stream",
    )


def test_upload_makes_the_image_active_with_its_checksum_and_size(client_for, project, store_dir):
    api = client_for(project.owner)
    created = _register(api, project, login_user="debian", min_disk_gib=2)
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["state"] == "uploading" and body["size_bytes"] == 0
    assert body["login_user"] == "debian" and body["visibility"] == "project"

    uploaded = _put(api, project, body["id"], DATA)
    assert uploaded.status_code == 200, uploaded.content
    image = uploaded.json()
    assert image["state"] == "active"
    assert image["checksum"] == SHA
    assert image["size_bytes"] == len(DATA)
    [stored] = _files(store_dir)
    assert stored.read_bytes() == DATA
    assert Image.objects.get(pk=body["id"]).location == str(stored.relative_to(store_dir))
    actions = set(
        AuditEvent.objects.filter(object_id=str(body["id"])).values_list("action", flat=True)
    )
    assert {"image.create", "image.upload"} <= actions
    listed = api.get(f"/api/v1/projects/{project.slug}/images/", {"state": "active"}).json()
    assert [i["id"] for i in listed["results"]] == [body["id"]]


def test_a_checksum_that_differs_fails_the_image_and_leaves_nothing(client_for, project, store_dir):
    api = client_for(project.owner)
    image_id = _register(api, project, checksum="sha256:" + "0" * 64).json()["id"]
    response = _put(api, project, image_id, DATA)
    assert response.status_code == 400
    assert "checksum" in response.json()["details"]
    image = api.get(f"/api/v1/projects/{project.slug}/images/{image_id}/").json()
    assert image["state"] == "failed"
    assert "checksum mismatch" in image["state_reason"] and SHA in image["state_reason"]
    assert _files(store_dir) == []
    assert AuditEvent.objects.filter(
        action="image.upload", object_id=str(image_id), outcome="failed"
    ).exists()


def test_the_expected_checksum_given_at_create_is_accepted_when_it_matches(client_for, project):
    api = client_for(project.owner)
    image_id = _register(api, project, checksum=SHA).json()["id"]
    assert _put(api, project, image_id, DATA).json()["state"] == "active"


def test_an_image_over_the_size_limit_is_413_and_stores_nothing(
    client_for, project, store_dir, settings
):
    settings.IMAGE_MAX_BYTES = 1000
    api = client_for(project.owner)
    image_id = _register(api, project).json()["id"]
    response = _put(api, project, image_id, DATA)
    assert response.status_code == 413
    assert response.json()["details"] == {"file": ["too large"]}
    assert Image.objects.get(pk=image_id).state == ImageState.FAILED
    assert _files(store_dir) == []


def test_only_an_uploading_image_takes_bytes(client_for, project):
    api = client_for(project.owner)
    image_id = _register(api, project).json()["id"]
    assert _put(api, project, image_id, DATA).status_code == 200
    again = _put(api, project, image_id, b"other bytes")
    assert again.status_code == 409
    assert again.json()["details"] == {"state": ["active"]}
    assert Image.objects.get(pk=image_id).checksum == SHA


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"format": "vmdk"}, "format"),
        ({"login_user": "Not a user!"}, "login_user"),
        ({"checksum": "md5:abc"}, "checksum"),
        ({"name": ""}, "name"),
        ({"min_disk_gib": -1}, "min_disk_gib"),
    ],
)
def test_bad_input_is_400_naming_the_field(client_for, project, fields, field):
    response = _register(client_for(project.owner), project, **fields)
    assert response.status_code == 400
    assert field in response.json()["details"]


def test_an_empty_upload_fails_the_image(client_for, project, store_dir):
    api = client_for(project.owner)
    image_id = _register(api, project).json()["id"]
    response = api.generic(
        "PUT",
        f"/api/v1/projects/{project.slug}/images/{image_id}/file/",
        b"",
        content_type="application/octet-stream",
        CONTENT_LENGTH="",
    )
    assert response.status_code == 400
    assert response.json()["details"] == {"file": ["is empty"]}
    assert Image.objects.get(pk=image_id).state == ImageState.FAILED
    assert _files(store_dir) == []


def test_deleting_an_image_a_vm_uses_is_409_naming_the_vm(
    client_for, project, store_dir, django_capture_on_commit_callbacks
):
    api = client_for(project.owner)
    image_id = _register(api, project).json()["id"]
    _put(api, project, image_id, DATA)
    vm = make_vm(project, image=Image.objects.get(pk=image_id), name="uses-it")
    url = f"/api/v1/projects/{project.slug}/images/{image_id}/"
    refused = api.delete(url)
    assert refused.status_code == 409
    assert "uses-it" in refused.json()["message"]
    assert len(_files(store_dir)) == 1

    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.DELETED)
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(url).status_code == 204
    assert api.get(url).status_code == 404
    assert Image.objects.get(pk=image_id).state == ImageState.DELETED
    assert _files(store_dir) == []
    assert AuditEvent.objects.filter(action="image.delete", object_id=str(image_id)).exists()


def test_uploading_and_failed_images_cannot_boot(client_for, project):
    api = client_for(project.owner)
    image_id = _register(api, project).json()["id"]
    from tests.factories import make_template

    response = api.post(
        f"/api/v1/projects/{project.slug}/vms/",
        {"name": "early", "template": make_template().name, "image": image_id},
        format="json",
    )
    assert response.status_code == 400
    assert "image" in response.json()["details"]


def test_upload_isolation(client_for, project, other_project, staff):
    theirs = _register(client_for(other_project.owner), other_project).json()["id"]
    outsider_put = _put(client_for(project.owner), project, theirs, DATA)
    assert outsider_put.status_code == 404
    # Not even through their project's URL without a role in it.
    assert _put(client_for(project.owner), other_project, theirs, DATA).status_code == 404
    assert Image.objects.get(pk=theirs).state == ImageState.UPLOADING

    reader = add_member(project, role=Role.READER)
    mine = _register(client_for(project.owner), project).json()["id"]
    assert _put(client_for(reader), project, mine, DATA).status_code == 403

    public = client_for(staff).post(
        "/api/v1/admin/images/",
        {"name": "pub", "os_distro": "debian", "format": "raw"},
        format="json",
    )
    assert public.status_code == 201 and public.json()["visibility"] == "public"
    pub_id = public.json()["id"]
    # A project may not upload into (nor see, while uploading) a public image.
    assert _put(client_for(project.owner), project, pub_id, DATA).status_code == 404
    done = client_for(staff).put(
        f"/api/v1/admin/images/{pub_id}/file/", data=DATA, content_type="application/octet-stream"
    )
    assert done.status_code == 200 and done.json()["state"] == "active"
    assert _put(client_for(project.owner), project, pub_id, DATA).status_code == 403
    listed = client_for(project.owner).get(f"/api/v1/projects/{project.slug}/images/").json()
    ids = {i["id"] for i in listed["results"]}
    assert pub_id in ids and theirs not in ids


def test_image_import_streams_a_file_and_is_idempotent_on_name_and_checksum(
    tmp_path, store_dir, staff
):
    source = tmp_path / "built.qcow2"
    source.write_bytes(DATA)
    first = services.image_import(
        source_path=source,
        name="debian-12",
        disk_format="qcow2",
        os_distro="debian",
        os_version="12",
        login_user="debian",
        visibility="public",
        actor=staff,
    )
    assert first.state == ImageState.ACTIVE and first.checksum == SHA
    assert first.size_bytes == len(DATA) and first.login_user == "debian"
    again = services.image_import(
        source_path=source,
        name="debian-12",
        disk_format="qcow2",
        os_distro="debian",
        os_version="12",
        login_user="debian",
        visibility="public",
    )
    assert again.pk == first.pk
    assert Image.objects.filter(name="debian-12").count() == 1
    assert len(_files(store_dir)) == 1
    event = AuditEvent.objects.get(action="image.upload", object_id=str(first.pk))
    assert event.actor == staff
    # New content under the same name is a new image.
    source.write_bytes(DATA + b"!")
    newer = services.image_import(
        source_path=source,
        name="debian-12",
        disk_format="qcow2",
        os_distro="debian",
        visibility="public",
    )
    assert newer.pk != first.pk


def test_a_host_is_told_a_file_url_with_the_checksum_and_size(tmp_path, store_dir, project):
    source = tmp_path / "img"
    source.write_bytes(DATA)
    image = services.image_import(
        source_path=source,
        name="x",
        disk_format="raw",
        os_distro="debian",
        visibility="project",
        project=project,
    )
    vm = make_vm(project, image=image)
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.PROVISIONING)
    vm.refresh_from_db()
    message = apply_message(vm)
    assert message.image_checksum == SHA and message.image_size == len(DATA)
    assert message.image_format == "raw"
    assert message.image_url.startswith("file://")
    assert Path(message.image_url[len("file://") :]).read_bytes() == DATA


def test_with_a_fetch_base_url_hosts_get_a_signed_url_the_web_streams(
    tmp_path, store_dir, project, settings, client
):
    settings.IMAGE_FETCH_BASE_URL = "http://kumo.example:8000"
    source = tmp_path / "img"
    source.write_bytes(DATA)
    image = services.image_import(
        source_path=source,
        name="x",
        disk_format="qcow2",
        os_distro="debian",
        visibility="project",
        project=project,
    )
    fetch = services.image_fetch(image)
    assert fetch["image_url"].startswith("http://kumo.example:8000/api/v1/image-files/")
    path = fetch["image_url"][len("http://kumo.example:8000") :]
    response = client.get(path)  # no credentials: the token is the credential
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == DATA
    assert response["Content-Length"] == str(len(DATA))
    assert client.get(path[:-3] + "xyz").status_code == 404
    settings.IMAGE_URL_TTL_S = -1
    assert client.get(path).status_code == 404


def test_the_store_is_the_configured_directory(store_dir):
    assert Path(image_store().root) == store_dir
