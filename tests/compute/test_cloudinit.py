"""cloud-init NoCloud seeds: what a guest reads back from the ISO, read with pycdlib through
the Rock Ridge names cloud-init mounts, and the volume label checked by blkid."""

import shutil
import subprocess

import pytest
import yaml

from compute.drivers import cloudinit
from compute.drivers.base import GuestNic, NicKind, PciAddress

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


NICS = (
    GuestNic(mac="52:54:00:0a:00:01", mtu=1450, device="tp-a", addresses=("10.0.0.5/24",)),
    GuestNic(
        mac="52:54:00:0a:00:02",
        mtu=1450,
        device="tp-b",
        addresses=("192.168.10.11/24", "fd00::11/64"),
        gateway="192.168.10.1",
        dns=("192.168.10.1", "9.9.9.9"),
        search=("alpha.internal",),
    ),
    GuestNic(
        mac="52:54:00:0a:00:03",
        mtu=9000,
        kind=NicKind.VF,
        pci_address=PciAddress.parse("0c:00.1"),
        addresses=("172.16.0.9/16",),
        gateway="172.16.0.1",
    ),
)


def test_nics_become_a_netplan_network_config_with_one_default_route(tmp_path):
    seed = cloudinit.read_seed(write(tmp_path, nics=NICS))
    assert yaml.safe_load(seed["network-config"]) == {
        "version": 2,
        "ethernets": {
            "ens-0": {
                "match": {"macaddress": "52:54:00:0a:00:01"},
                "set-name": "ens-0",
                "mtu": 1450,
                "addresses": ["10.0.0.5/24"],
            },
            "ens-1": {
                "match": {"macaddress": "52:54:00:0a:00:02"},
                "set-name": "ens-1",
                "mtu": 1450,
                "addresses": ["192.168.10.11/24", "fd00::11/64"],
                "routes": [{"to": "0.0.0.0/0", "via": "192.168.10.1"}],
                "nameservers": {
                    "addresses": ["192.168.10.1", "9.9.9.9"],
                    "search": ["alpha.internal"],
                },
            },
            "ens-2": {  # a VF NIC: its gateway is not a second default route
                "match": {"macaddress": "52:54:00:0a:00:03"},
                "set-name": "ens-2",
                "mtu": 9000,
                "addresses": ["172.16.0.9/16"],
            },
        },
    }
    assert seed["meta-data"] == cloudinit.read_seed(write(tmp_path))["meta-data"]


def test_an_ipv6_gateway_is_the_ipv6_default_route():
    nic = GuestNic(mac="52:54:00:0a:00:01", mtu=1500, device="tp-a", gateway="fd00::1")
    ethernet = yaml.safe_load(cloudinit.network_config([nic]))["ethernets"]["ens-0"]
    assert ethernet["routes"] == [{"to": "::/0", "via": "fd00::1"}]


def test_without_nics_no_network_config_and_dropping_them_removes_it(tmp_path):
    assert "network-config" not in cloudinit.read_seed(write(tmp_path))
    path = write(tmp_path, nics=NICS)
    before = path.stat()
    assert write(tmp_path, nics=NICS) == path
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    write(tmp_path)  # a later generation without NICs
    assert path.stat().st_ino != before.st_ino
    assert "network-config" not in cloudinit.read_seed(path)


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
