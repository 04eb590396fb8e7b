"""cloud-init NoCloud seeds: what a guest reads back from the ISO, read with pycdlib through
the Rock Ridge names cloud-init mounts, and the volume label checked by blkid."""

import shutil
import subprocess

import pytest
import yaml

from compute.drivers import cloudinit

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0bXW1ZsJpEZx8o8DE2oqQxJgG6a4rGBpOIxYIJ2dJi ai@lab"
USER_DATA = "#cloud-config\npackages: [htop]\nruncmd:\n  - echo 'hello'  # stays as written\n"


def write(tmp_path, **overrides):
    fields = {
        "instance_id": "3f1c",
        "hostname": "train-01",
        "ssh_keys": [KEY],
        "user_data": USER_DATA,
        "files": {"/etc/nccl.conf": "NCCL_TOPO_FILE=/etc/nccl/kumo-topo.xml\n"},
    }
    fields.update(overrides)
    return cloudinit.write_seed(tmp_path / "vm" / "seed.iso", **fields)


def test_seed_carries_identity_keys_user_data_and_kumo_files(tmp_path):
    seed = cloudinit.read_seed(write(tmp_path))
    assert seed["label"] == "cidata"
    assert yaml.safe_load(seed["meta-data"]) == {
        "instance-id": "3f1c",
        "local-hostname": "train-01",
        "public-keys": [KEY],
    }
    assert seed["user-data"] == USER_DATA  # the user's own, byte for byte
    vendor = seed["vendor-data"]
    assert vendor.startswith("#cloud-config\n")
    assert yaml.safe_load(vendor)["write_files"] == [
        {
            "path": "/etc/nccl.conf",
            "content": "NCCL_TOPO_FILE=/etc/nccl/kumo-topo.xml\n",
            "permissions": "0644",
            "owner": "root:root",
        }
    ]


def test_no_keys_no_user_data_no_files(tmp_path):
    seed = cloudinit.read_seed(write(tmp_path, ssh_keys=[], user_data="", files={}))
    assert yaml.safe_load(seed["meta-data"]) == {
        "instance-id": "3f1c",
        "local-hostname": "train-01",
    }
    assert seed["user-data"] == seed["vendor-data"] == ""


def test_rewriting_the_same_seed_leaves_the_file_and_a_change_replaces_it(tmp_path):
    path = write(tmp_path)
    before = path.stat()
    assert write(tmp_path) == path
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert path.stat().st_ino == before.st_ino
    write(tmp_path, hostname="train-02")
    assert path.stat().st_ino != before.st_ino  # replaced by rename, never rewritten in place
    assert "train-02" in cloudinit.read_seed(path)["meta-data"]
    assert [p.name for p in path.parent.iterdir()] == ["seed.iso"]  # no partial left behind


def test_a_torn_seed_is_rewritten(tmp_path):
    path = write(tmp_path)
    path.write_bytes(b"\0" * 100)
    write(tmp_path)
    assert cloudinit.read_seed(path)["label"] == "cidata"


@pytest.mark.skipif(shutil.which("blkid") is None, reason="blkid (util-linux) is not installed")
def test_blkid_sees_an_iso9660_volume_labelled_cidata(tmp_path):
    out = subprocess.run(
        ["blkid", "-o", "export", str(write(tmp_path))], capture_output=True, text=True, check=True
    ).stdout
    assert "TYPE=iso9660" in out.splitlines()
    assert "LABEL=cidata" in out.splitlines()
