"""Acceptance: an image of several hundred MiB uploads through the API to a real web process
(gunicorn, as ``manage.py run`` starts it) with that process's memory staying flat: the
body is streamed into the store, never held."""

import hashlib
import os
import sys
from pathlib import Path

import httpx
import pytest

from compute.models import Image
from tests.e2e.processes import Fleet, database_url, free_port, wait_for
from tests.factories import make_project, token_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MIB = 1 << 20
IMAGE_MIB = 300


def _hwm_kib(pid: int) -> int:
    """The process's peak resident set size (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def _worker_pid(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


class Generated:
    """``size`` bytes made on the fly (never held), hashed as they are sent."""

    def __init__(self, size: int):
        self.size = size
        self.sha = hashlib.sha256()

    def __iter__(self):
        block = bytearray(os.urandom(MIB))
        for i in range(self.size // MIB):
            block[:8] = i.to_bytes(8, "little")  # every MiB differs
            chunk = bytes(block)
            self.sha.update(chunk)
            yield chunk


@pytest.fixture
def web(tmp_path):
    port = free_port()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        KUMO_VAR_DIR=str(tmp_path),
        KUMO_IMAGE_STORE="dir",
        KUMO_IMAGE_STORE_DIR=str(tmp_path / "store"),
        DATABASE_TEST_NAME="",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    fleet = Fleet(env, tmp_path)
    proc = fleet.start(
        "web",
        [
            sys.executable, "-m", "gunicorn", "controlplane.wsgi:application",
            "--bind", f"127.0.0.1:{port}", "--workers", "1", "--timeout", "120",
        ],
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{base}/api/v1/templates/", timeout=2).status_code == 401
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=60, what="gunicorn", fleet=fleet)
    yield base, proc.pid, tmp_path / "store"
    fleet.stop()


def _register(api, slug, name):
    response = api.post(
        f"/api/v1/projects/{slug}/images/",
        json={"name": name, "os_distro": "debian", "format": "raw", "login_user": "debian"},
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_a_300_mib_upload_keeps_the_web_process_memory_flat(web):
    base, master, store = web
    project = make_project()
    api = httpx.Client(
        base_url=base,
        headers={"Authorization": f"Bearer {token_for(project.owner)}"},
        timeout=120,
    )
    slug = project.slug

    # Warm-up: a small upload, chunked (gunicorn de-chunks it), so every code path is loaded.
    warm = _register(api, slug, "warm")
    small = api.put(
        f"/api/v1/projects/{slug}/images/{warm}/file/",
        content=iter([b"x" * 1000, b"y" * 24]),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert small.status_code == 200, small.text
    assert small.json()["size_bytes"] == 1024
    worker = _worker_pid(master)
    before = _hwm_kib(worker)

    big = _register(api, slug, "big")
    body = Generated(IMAGE_MIB * MIB)
    response = api.put(
        f"/api/v1/projects/{slug}/images/{big}/file/",
        content=iter(body),
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Length": str(body.size),
        },
    )
    assert response.status_code == 200, response.text
    after = _hwm_kib(worker)
    assert _worker_pid(master) == worker  # the same worker served it all

    image = response.json()
    assert image["state"] == "active"
    assert image["size_bytes"] == IMAGE_MIB * MIB
    assert image["checksum"] == "sha256:" + body.sha.hexdigest()
    stored = store / Image.objects.get(pk=big).location
    assert stored.stat().st_size == IMAGE_MIB * MIB
    grew_mib = (after - before) / 1024
    print(f"web worker VmHWM: {before / 1024:.1f} MiB before, {after / 1024:.1f} MiB after "
          f"a {IMAGE_MIB} MiB upload (grew {grew_mib:.1f} MiB)")  # fmt: skip
    assert grew_mib < 16, f"the web worker's peak RSS grew {grew_mib:.1f} MiB"
