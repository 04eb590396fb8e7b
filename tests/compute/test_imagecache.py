"""A host's image cache: fetched from a real HTTP server on loopback, verified by checksum,
never half-written, fetched once for two guests at once (threads and processes), a
corrupted copy caught; and the agent's use of it for a guest's root disk."""

import hashlib
import http.server
import multiprocessing
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from compute import host_tasks
from compute.drivers import simnode
from compute.drivers.base import DriverError
from compute.drivers.fake import FakeDriver
from compute.drivers.imagecache import (
    ImageCache,
    ImageCacheError,
    ImageChecksumMismatch,
    backing_file,
)
from compute.protocol import VmApply
from controlplane.agent import reports, runtime
from controlplane.agent.config import AgentConfig

DATA = b"\x00kumo-image\xff" * 200_000  # 2.6 MB
SHA = "sha256:" + hashlib.sha256(DATA).hexdigest()


class ImageServer:
    """Serves ``body`` at every path, slowly enough for two fetches to overlap; counts GETs."""

    def __init__(self, body: bytes, delay_s: float = 0.3):
        self.body, self.delay_s = body, delay_s
        self.gets = multiprocessing.Value("i", 0)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with server.gets.get_lock():
                    server.gets.value += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                half = len(server.body) // 2
                self.wfile.write(server.body[:half])
                time.sleep(server.delay_s)
                self.wfile.write(server.body[half:])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/image"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = ImageServer(DATA)
    yield s
    s.stop()


def _leftovers(root: Path) -> list[str]:
    partial = root / ".partial"
    return sorted(p.name for p in partial.iterdir()) if partial.exists() else []


def test_a_first_use_fetches_and_verifies(tmp_path, server):
    cache = ImageCache(tmp_path)
    path = cache.ensure(checksum=SHA, size=len(DATA), url=server.url)
    assert path == tmp_path / SHA[7:]
    assert path.read_bytes() == DATA
    assert cache.ensure(checksum=SHA, size=len(DATA), url=server.url) == path
    assert server.gets.value == 1
    assert _leftovers(tmp_path) == []


def test_a_checksum_mismatch_fails_and_leaves_nothing(tmp_path):
    bad = ImageServer(DATA[:-1] + b"!")
    try:
        with pytest.raises(ImageChecksumMismatch, match="checksum mismatch"):
            ImageCache(tmp_path).ensure(checksum=SHA, size=len(DATA), url=bad.url)
    finally:
        bad.stop()
    assert not (tmp_path / SHA[7:]).exists()
    assert _leftovers(tmp_path) == []


def test_more_bytes_than_expected_fail_and_leave_nothing(tmp_path, server):
    with pytest.raises(ImageChecksumMismatch):
        ImageCache(tmp_path).ensure(checksum=SHA, size=len(DATA) - 5, url=server.url)
    assert not (tmp_path / SHA[7:]).exists() and _leftovers(tmp_path) == []


def test_an_unreachable_source_is_a_cache_error(tmp_path):
    with pytest.raises(ImageCacheError):
        ImageCache(tmp_path).ensure(checksum=SHA, size=1, url="http://127.0.0.1:9/nothing")
    with pytest.raises(ImageCacheError):
        ImageCache(tmp_path).ensure(checksum=SHA, size=1, url="ftp://example/x")


def test_a_corrupted_cached_copy_is_caught_and_fetched_again(tmp_path, server):
    cache = ImageCache(tmp_path)
    path = cache.ensure(checksum=SHA, size=len(DATA), url=server.url)
    with open(path, "r+b") as f:  # one flipped byte on disk
        f.seek(1000)
        f.write(b"\x01")
    again = cache.ensure(checksum=SHA, size=len(DATA), url=server.url)
    assert again.read_bytes() == DATA
    assert server.gets.value == 2


def test_a_corrupted_copy_whose_source_is_also_bad_fails_and_leaves_nothing(tmp_path):
    (tmp_path / SHA[7:]).write_bytes(DATA[:-1] + b"?")
    bad = ImageServer(DATA[:-1] + b"!")
    try:
        with pytest.raises(ImageChecksumMismatch):
            ImageCache(tmp_path).ensure(checksum=SHA, size=len(DATA), url=bad.url)
    finally:
        bad.stop()
    assert not (tmp_path / SHA[7:]).exists() and _leftovers(tmp_path) == []


def test_two_guests_at_once_download_once_threads(tmp_path, server):
    cache = ImageCache(tmp_path)
    with ThreadPoolExecutor(4) as pool:
        paths = list(
            pool.map(lambda _: cache.ensure(checksum=SHA, size=len(DATA), url=server.url), range(4))
        )
    assert len(set(paths)) == 1 and paths[0].read_bytes() == DATA
    assert server.gets.value == 1


def _ensure_in_child(root: str, url: str, out) -> None:
    out.put(str(ImageCache(root).ensure(checksum=SHA, size=len(DATA), url=url)))


def test_two_guests_at_once_download_once_processes(tmp_path, server):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [
        ctx.Process(target=_ensure_in_child, args=(str(tmp_path), server.url, out))
        for _ in range(3)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert {out.get(timeout=5) for _ in children} == {str(tmp_path / SHA[7:])}
    assert server.gets.value == 1


# --- the agent: a guest's root disk is an overlay on the cached image ----------------------


class DiskFake(FakeDriver):
    """The fake hypervisor on a host that reads disks (as a real one does)."""

    simulated = False


VM = "0b4e2c1a-5d6f-4e3b-9a8c-7d6e5f4a3b2c"


@pytest.fixture
def agent(tmp_path):
    runtime.configure(
        AgentConfig.from_env(
            host="cpu-01",
            instances_dir=tmp_path / "instances",
            image_cache_dir=tmp_path / "cache",
            shelve_store=tmp_path / "shelved",
        )
    )
    yield tmp_path
    runtime.configure(None)


def _message(url: str, **fields) -> VmApply:
    values = {
        "vm_id": VM,
        "generation": 1,
        "desired": "running",
        "name": "lab/cpu-1",
        "hostname": "cpu-1",
        "vcpus": 1,
        "memory_mib": 256,
        "image_format": "raw",
        "image_url": url,
        "image_checksum": SHA,
        "image_size": len(DATA),
        "disk_gib": 1,
    }
    return VmApply(**{**values, **fields})


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img is not installed")
def test_the_root_disk_is_an_overlay_on_the_verified_cached_image(agent, server):
    assert host_tasks.apply(
        _message(server.url), DiskFake(inventory=simnode.host_inventory("cpu"))
    ) == (
        1,
        "running",
    )
    root = agent / "instances" / VM / "root.qcow2"
    info = subprocess.run(
        ["qemu-img", "info", "-U", "--output=json", str(root)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(agent / "cache" / SHA[7:]) in info
    assert '"backing-filename-format": "raw"' in info


def test_a_mismatch_fails_the_vm_with_a_clear_error_reported(agent, monkeypatch):
    bad = ImageServer(DATA[:-1] + b"!", delay_s=0)
    sent = []
    monkeypatch.setattr(reports, "send", lambda host, kind, payload: sent.append(payload))
    monkeypatch.setattr(
        host_tasks, "driver", lambda: DiskFake(inventory=simnode.host_inventory("cpu"))
    )
    try:
        with pytest.raises(DriverError, match="checksum mismatch"):
            host_tasks.apply(_message(bad.url), DiskFake(inventory=simnode.host_inventory("cpu")))
        host_tasks.vm_apply(**_message(bad.url, operation_id="op-1").to_wire())
    finally:
        bad.stop()
    [report] = sent
    assert report["ok"] is False and report["vm_id"] == VM
    assert "checksum mismatch" in report["error"] and SHA in report["error"]
    assert not (agent / "cache" / SHA[7:]).exists()
    assert not (agent / "instances" / VM / "root.qcow2").exists()


# --- pruning ------------------------------------------------------------------------------

DAY = 86400.0


def _copy(root: Path, name: str, *, age_s: float) -> Path:
    """A cached copy named ``name`` (its checksum's hex), last used ``age_s`` ago."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(DATA[:4096])
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def _overlay(disk: Path, base: Path) -> Path:
    disk.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base), str(disk)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return disk


def test_prune_removes_only_old_copies_no_disk_is_based_on(tmp_path):
    cache = ImageCache(tmp_path)
    used = _copy(tmp_path, "a" * 64, age_s=3 * DAY)
    old = _copy(tmp_path, "b" * 64, age_s=2 * DAY)
    young = _copy(tmp_path, "c" * 64, age_s=60)
    (tmp_path / ".partial").mkdir()
    stray = _copy(tmp_path, "notes.txt", age_s=9 * DAY)  # not a copy: never Kumo's to remove

    assert cache.prune({used.resolve()}, min_age_s=DAY) == ["sha256:" + "b" * 64]
    assert used.exists() and young.exists() and stray.exists() and not old.exists()
    assert (tmp_path / ".partial").is_dir()
    assert cache.prune({used.resolve()}, min_age_s=DAY) == []  # a repeat removes nothing
    assert ImageCache(tmp_path / "never-made").prune(set(), min_age_s=0) == []


def test_over_its_cap_the_least_recently_used_unused_copies_go_first(tmp_path, caplog):
    cache = ImageCache(tmp_path)
    mib = 1 << 20

    def sized(name, age_s):
        path = _copy(tmp_path, name * 64, age_s=age_s)
        path.write_bytes(b"\1" * mib)
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    oldest, older, recent = sized("a", 5 * 3600), sized("b", 3 * 3600), sized("c", 2 * 3600)
    used = sized("d", 10 * 3600)  # a guest's disk is based on it: stays, though the oldest
    fresh = sized("e", 60)  # ensure answered it a minute ago: its overlay comes next
    # No cap: none is a day old, none goes.
    assert cache.prune({used.resolve()}, min_age_s=DAY) == []
    # 5 MiB under a cap of 3: the two least recently used of those no disk is based on go.
    gone = cache.prune({used.resolve()}, min_age_s=DAY, max_bytes=3 * mib)
    assert gone == ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
    assert not oldest.exists() and not older.exists()
    assert recent.exists() and used.exists() and fresh.exists()
    assert "over its cap" not in caplog.text
    # Under a cap of 1 MiB only the recent one can go: the rest are a disk's or too young.
    gone = cache.prune({used.resolve()}, min_age_s=DAY, max_bytes=mib)
    assert gone == ["sha256:" + "c" * 64] and used.exists() and fresh.exists()
    assert "over its cap of 1048576" in caplog.text


def test_a_copy_ensure_answered_counts_as_used_now(tmp_path, server):
    cache = ImageCache(tmp_path)
    path = _copy(tmp_path, SHA[7:], age_s=0)
    path.write_bytes(DATA)
    then = time.time() - 2 * DAY
    os.utime(path, (then, then))
    assert cache.ensure(checksum=SHA, size=len(DATA), url=server.url) == path
    assert server.gets.value == 0  # verified, not fetched
    assert cache.prune(set(), min_age_s=DAY) == []
    assert path.exists()


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img is not installed")
def test_backing_file_reads_the_qcow2_header(tmp_path):
    base = _copy(tmp_path / "cache", "a" * 64, age_s=0)
    assert backing_file(_overlay(tmp_path / "vm" / "root.qcow2", base)) == base.resolve()
    # A name relative to the disk's folder, as qemu-img keeps it.
    relative = tmp_path / "cache" / "rel.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "a" * 64, str(relative)],
        check=True,
        capture_output=True,
        timeout=60,
        cwd=tmp_path / "cache",
    )
    assert backing_file(relative) == base.resolve()
    alone = tmp_path / "alone.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", str(alone), "1M"], check=True, timeout=60
    )
    assert backing_file(alone) is None
    assert backing_file(base) is None  # raw: not qcow2
    assert backing_file(tmp_path / "missing.qcow2") is None


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img is not installed")
def test_the_agent_prunes_what_no_guest_and_no_kept_disk_is_based_on(agent):
    cache = agent / "cache"
    guest_base = _copy(cache, "a" * 64, age_s=3 * DAY)
    kept_base = _copy(cache, "b" * 64, age_s=3 * DAY)
    unused = _copy(cache, "c" * 64, age_s=3 * DAY)
    _overlay(agent / "instances" / VM / "root.qcow2", guest_base)
    # A disk kept by an earlier shelve, when kept disks were overlays on a copy.
    _overlay(agent / "shelved" / f"{VM}.qcow2", kept_base)

    assert host_tasks.prune_image_cache() == ["sha256:" + "c" * 64]
    assert guest_base.exists() and kept_base.exists() and not unused.exists()


def test_the_agents_prune_holds_the_cache_to_its_cap(agent):
    cache = agent / "cache"
    hour_old = _copy(cache, "a" * 64, age_s=3600)  # unused, but not for a day
    assert host_tasks.prune_image_cache() == []  # no cap by default
    runtime.configure(replace(runtime.config(), image_cache_max_gib=1 / 2**30))  # one byte
    assert host_tasks.prune_image_cache() == ["sha256:" + "a" * 64]
    assert not hour_old.exists()


def test_a_copy_whose_lock_is_held_stays_and_the_prune_does_not_wait(tmp_path):
    cache = ImageCache(tmp_path)
    busy = _copy(tmp_path, "d" * 64, age_s=3 * DAY)
    with cache._lock("d" * 64):  # a guest's ensure checking it, in another thread
        done = ThreadPoolExecutor(1).submit(cache.prune, set(), min_age_s=DAY)
        assert done.result(timeout=10) == []
    assert busy.exists()
    assert cache.prune(set(), min_age_s=DAY) == ["sha256:" + "d" * 64]


def test_the_agents_prune_runs_in_a_thread_of_its_own(agent, monkeypatch):
    started, release = threading.Event(), threading.Event()
    pruned = []

    def slow():
        started.set()
        release.wait(10)
        pruned.append(True)

    monkeypatch.setattr(host_tasks, "prune_image_cache", slow)
    host_tasks.image_cache_prune()  # returns at once: the timer thread is not held
    assert started.wait(10)
    host_tasks.image_cache_prune()  # one still running: no second one
    release.set()
    deadline = time.monotonic() + 10
    while host_tasks._pruning.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pruned == [True]


def test_the_prune_is_an_hourly_agent_report_and_reads_its_settings(monkeypatch, tmp_path):
    from controlplane.agent import plugins

    assert ("compute.host_tasks:image_cache_prune", "image_cache_prune_s") in plugins.REPORTERS
    defaults = AgentConfig.from_env(host="h")
    assert (defaults.image_cache_prune_s, defaults.image_cache_min_age_s) == (3600.0, DAY)
    assert defaults.image_cache_max_gib == 0  # no cap
    monkeypatch.setenv("KUMO_IMAGE_CACHE_PRUNE_INTERVAL_S", "600")
    monkeypatch.setenv("KUMO_IMAGE_CACHE_MIN_AGE_S", "7200")
    monkeypatch.setenv("KUMO_IMAGE_CACHE_MAX_GIB", "50")
    monkeypatch.setenv("KUMO_SHELVE_STORE", str(tmp_path))
    config = AgentConfig.from_env(host="h")
    assert (config.image_cache_prune_s, config.image_cache_min_age_s) == (600.0, 7200.0)
    assert config.image_cache_max_gib == 50.0
    assert config.shelve_store == tmp_path
