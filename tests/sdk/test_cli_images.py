"""``kumo image`` and the SDK's image upload against a live Kumo (gunicorn): upload a file
(streamed, checked by SHA-256), list, show, a failed upload with its reason, delete."""

import hashlib
import json

import pytest

from compute.models import Image
from tests.factories import make_vm
from tests.sdk.conftest import PASSWORD, can_log_in

pytestmark = pytest.mark.e2e


@pytest.fixture
def logged_in(server, owner, project, kumo_cli):
    can_log_in(owner)
    kumo_cli("login", server.url, "--username", owner.username, "--password", PASSWORD)
    kumo_cli("project", "use", project.slug)
    return kumo_cli


def test_image_upload_list_show_delete(logged_in, project, tmp_path):
    data = b"a disk image" * 50_000
    path = tmp_path / "disk.raw"
    path.write_bytes(data)
    out = logged_in(
        "image", "upload", str(path), "--name", "mine", "--os-distro", "debian",
        "--os-version", "12", "--format", "raw", "--login-user", "debian", "--json",
    )  # fmt: skip
    image = json.loads(out.stdout)
    assert image["state"] == "active" and image["size_bytes"] == len(data)
    assert image["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert image["login_user"] == "debian"

    listed = logged_in("image", "list").stdout
    assert "mine" in listed and "active" in listed
    shown = logged_in("image", "show", "mine").stdout
    assert "active" in shown and "debian" in shown
    assert json.loads(logged_in("image", "show", "mine", "--json").stdout) == image

    failed = logged_in(
        "image", "upload", str(path), "--name", "bad", "--os-distro", "debian",
        "--checksum", "sha256:" + "0" * 64, ok=False,
    )  # fmt: skip
    assert failed.exit_code == 1 and "checksum" in failed.stderr
    bad = json.loads(logged_in("image", "show", "bad", "--json").stdout)
    assert bad["state"] == "failed" and "checksum mismatch" in bad["state_reason"]

    vm = make_vm(project, image=Image.objects.get(pk=image["id"]), name="on-mine")
    refused = logged_in("image", "delete", "mine", ok=False)
    assert refused.exit_code == 1 and "on-mine" in refused.stderr
    vm.delete()
    logged_in("image", "delete", "mine")
    assert "mine" not in logged_in("image", "list").stdout.split()


def test_sdk_upload(kumo, tmp_path):
    path = tmp_path / "disk.qcow2"
    path.write_bytes(b"q" * 3_000_000)
    created = kumo.images.create("sdk-img", os_distro="debian", format="qcow2")
    assert created.state == "uploading"
    image = kumo.images.upload(created.id, path)
    assert image.state == "active" and image.size_bytes == 3_000_000
