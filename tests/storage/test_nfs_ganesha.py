"""Shares reachable only by their project, against a real NFS server: nfs-ganesha (a
userspace server; this kernel has no nfsd) runs as root in a network namespace the test
makes, with the exports Kumo's NFS driver writes, reloaded by the driver (SIGHUP). Two
client namespaces stand for a VM of the share's project and a VM of another project; each
asks the server to mount the share with the MOUNT protocol's MNT call, the access check a
Linux client's mount goes through (this kernel has no NFS client either). Mounting from
inside real guests is the real-guest test's part."""

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from storage.drivers.base import ShareSpec
from storage.drivers.nfs import NfsShareDriver
from tests.storage.nfs_client import MNT3_OK, MNT3ERR_ACCES
from tests.storage.test_nfs import _loop_mounts_work

MNT_PORT = 20048
ROOT = Path(__file__).resolve().parents[2]


def _missing() -> str:
    if reason := _loop_mounts_work():
        return reason
    for tool in ("ganesha.nfsd", "rpcbind", "unshare", "ip"):
        if not shutil.which(tool):
            return f"needs {tool} (make: nfs-ganesha, nfs-ganesha-vfs, rpcbind)"
    return ""


pytestmark = pytest.mark.skipif(bool(_missing()), reason=_missing() or "-")

GANESHA_CONF = """NFS_CORE_PARAM {{
    Protocols = 3, 4;
    NFS_Port = 2049;
    MNT_Port = {mnt_port};
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}}
NFSV4 {{ Graceless = true; }}
NFS_KRB5 {{ Active_krb5 = false; }}
%include "{exports}"
"""
# rpcbind (ganesha registers its programs there) and ganesha's state live in a private
# mount namespace: /run and /var/lib/nfs are the test's own, not the machine's.
START = """set -e
mount -t tmpfs tmpfs /run
mkdir -p /var/lib/nfs && mount -t tmpfs tmpfs /var/lib/nfs && mkdir -p /var/lib/nfs/ganesha
rpcbind -f -w &
sleep 0.3
exec ganesha.nfsd -F -f {conf} -L {log} -p {pidfile} -N NIV_EVENT
"""


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def nfs(tmp_path):
    """A ganesha in namespace ``server`` reached from namespaces ``a`` (10.x.1.2) and ``b``
    (10.x.2.2) over veth pairs; everything removed afterwards."""
    tag = uuid.uuid4().hex[:6]
    octet = int(tag[:2], 16) % 200 + 20
    names = {n: f"kt-nfs-{tag}-{n}" for n in ("server", "a", "b")}
    made, ganesha = [], None
    try:
        for ns in names.values():
            ip("netns", "add", ns)
            made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        addresses = {}
        for index, side in enumerate(("a", "b"), start=1):
            ip("link", "add", f"kn{tag}{side}", "netns", names["server"], "type", "veth",
               "peer", "name", "eth0", "netns", names[side])  # fmt: skip
            ip("-n", names["server"], "addr", "add", f"10.{octet}.{index}.1/24", "dev",
               f"kn{tag}{side}")  # fmt: skip
            ip("-n", names["server"], "link", "set", f"kn{tag}{side}", "up")
            ip("-n", names[side], "addr", "add", f"10.{octet}.{index}.2/24", "dev", "eth0")
            ip("-n", names[side], "link", "set", "eth0", "up")
            addresses[side] = (f"10.{octet}.{index}.2", f"10.{octet}.{index}.1")
        exports = tmp_path / "kumo-exports.conf"
        exports.write_text("")
        conf, log, pidfile = tmp_path / "ganesha.conf", tmp_path / "ganesha.log", tmp_path / "pid"
        conf.write_text(GANESHA_CONF.format(mnt_port=MNT_PORT, exports=exports))
        script = START.format(conf=conf, log=log, pidfile=pidfile)
        ganesha = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                names["server"],
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            start_new_session=True,
        )
        _wait(lambda: "NFS SERVER INITIALIZED" in _text(log), "ganesha to start", log)
        driver = NfsShareDriver(
            str(tmp_path / "nfs"),
            exports_file=str(exports),
            server="ganesha",
            ganesha_pidfile=str(pidfile),
        )
        yield driver, names, addresses, log
    finally:
        if ganesha is not None:
            os.killpg(ganesha.pid, signal.SIGTERM)  # ganesha and its rpcbind: the test's
            ganesha.wait(timeout=20)
        for mount in sorted((tmp_path / "nfs" / "exports").glob("*")):
            if os.path.ismount(mount):
                subprocess.run(["umount", str(mount)], check=False)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], check=False)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _wait(ready, what: str, log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{_text(log)[-3000:]}")
        time.sleep(0.2)


def mnt_from(names, addresses, side: str, path: str) -> int:
    """MNT ``path`` sent from namespace ``side`` (a VM of that project)."""
    _own, server = addresses[side]
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            names[side],
            sys.executable,
            "-m",
            "tests.storage.nfs_client",
            server,
            str(MNT_PORT),
            path,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def _answers(names, addresses, path: str, want: dict, log: Path) -> None:
    """Wait until the server gives each side the answer wanted (a reload takes effect
    within moments of the SIGHUP)."""
    seen = {}

    def ok():
        seen.update({side: mnt_from(names, addresses, side, path) for side in want})
        return seen == want

    _wait(ok, f"MNT answers {want} (last {seen})", log)


def test_a_share_is_exported_to_its_projects_vms_only(nfs):
    driver, names, addresses, log = nfs
    a, b = addresses["a"][0], addresses["b"][0]
    spec = ShareSpec(name="genome-1a2b", project_number=100001, quota_gib=1, clients=(a,))
    driver.ensure_share(spec)
    path = str(driver.mountpoint(spec))
    _answers(names, addresses, path, {"a": MNT3_OK, "b": MNT3ERR_ACCES}, log)
    assert "Reread exports complete" in _text(log)

    # The project's VMs changed: the VM at b is now the project's, a is gone.
    moved = ShareSpec(name=spec.name, project_number=100001, quota_gib=1, clients=(b,))
    driver.ensure_share(moved)
    _answers(names, addresses, path, {"a": MNT3ERR_ACCES, "b": MNT3_OK}, log)

    # A second project's share beside it: each reaches its own only.
    other = ShareSpec(name="climate-9f8e", project_number=100002, quota_gib=1, clients=(a,))
    driver.ensure_share(other)
    other_path = str(driver.mountpoint(other))
    _answers(names, addresses, other_path, {"a": MNT3_OK, "b": MNT3ERR_ACCES}, log)
    _answers(names, addresses, path, {"a": MNT3ERR_ACCES, "b": MNT3_OK}, log)

    # No VM left: the share is exported to nobody.
    driver.ensure_share(ShareSpec(name=spec.name, project_number=100001, quota_gib=1))
    refused = {}

    def nobody():
        refused.update({s: mnt_from(names, addresses, s, path) for s in ("a", "b")})
        return MNT3_OK not in refused.values()

    _wait(nobody, f"nobody to be let in (last {refused})", log)
    driver.ensure_share_absent(other)
    driver.ensure_share_absent(spec)
