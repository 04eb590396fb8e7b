"""cloud-init NoCloud seeds: the ISO a guest reads its identity, keys and files from.

A seed is an ISO 9660 image labelled ``cidata`` holding, as cloud-init's NoCloud data
source reads them:

- ``meta-data``: ``instance-id`` (the VM's id: stable for its whole life, since a new id
  makes cloud-init treat a reboot as a new instance and regenerate its SSH host keys),
  ``local-hostname`` and ``public-keys`` (the user's SSH keys);
- ``user-data``: the user's own cloud-init user-data, byte for byte (empty when none);
- ``vendor-data``: Kumo's part, a ``#cloud-config`` with ``write_files`` (the NCCL topology
  of a GPU guest). Vendor data is the provider's channel: the user's user-data is never
  rewritten, and may still switch vendor data off;
- ``network-config``, only for a guest with NICs: netplan version 2 (``network_config``).
  A seed without NICs has no such file, so cloud-init's own fallback applies.

The ISO is written with pycdlib (pure Python, no genisoimage on the host) with Joliet and
Rock Ridge names, as ``genisoimage -J -r`` makes them: cloud-init mounts the seed and
looks for the lower-case names. Writing is atomic (a temporary file renamed over the
target) and a repeat with the same content leaves the file as it is.
"""

from __future__ import annotations

import io
import ipaddress
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pycdlib
import yaml
from pycdlib.pycdlibexception import PyCdlibInvalidInput

from compute.drivers.base import GuestNic

VOLUME_LABEL = "cidata"
# (ISO 9660 level-1 name, the real name cloud-init looks for)
_FILES = (
    ("METADATA.;1", "meta-data"),
    ("USERDATA.;1", "user-data"),
    ("VENDORDA.;1", "vendor-data"),
    ("NETWORKC.;1", "network-config"),
)
_OPTIONAL = {"network-config"}  # present only when it has content
# The guest's name for its n-th NIC: the dash keeps it clear of the kernel's (eth0) and
# udev's (ens3, enp1s0) names, which a rename must not take.
NIC_NAME_PREFIX = "ens-"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so a written file reads as itself."""


_Dumper.add_representer(
    str,
    lambda dumper, value: dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
    ),
)


def meta_data(*, instance_id: str, hostname: str, ssh_keys: Sequence[str]) -> str:
    """NoCloud ``meta-data`` (YAML)."""
    data: dict = {"instance-id": instance_id, "local-hostname": hostname}
    if ssh_keys:
        data["public-keys"] = list(ssh_keys)
    return yaml.safe_dump(data, sort_keys=False)


def vendor_data(
    files: Mapping[str, str],
    mounts: Sequence[Sequence[str]] = (),
    private_files: Mapping[str, str] | None = None,
    commands: Sequence[Sequence[str]] = (),
) -> str:
    """Kumo's ``#cloud-config``: each of ``files`` (guest path: text) written at first boot
    of this instance id, readable by everyone (they describe hardware, hold no secret), and
    each of ``mounts`` ((source, mount point, fstype, options): the project's shared file
    systems) in the guest's fstab and mounted. ``private_files`` are written readable by root
    only (the guest's metadata token). ``commands`` (argv lists) run once, late in the first
    boot (``runcmd``: enabling the services Kumo ships, ``compute.drivers.spotwatch``)."""
    if not files and not mounts and not private_files and not commands:
        return ""
    config: dict = {}
    if files:
        config["write_files"] = [
            {"path": path, "content": content, "permissions": "0644", "owner": "root:root"}
            for path, content in sorted(files.items())
        ]
    if private_files:
        config.setdefault("write_files", []).extend(
            {"path": path, "content": content, "permissions": "0600", "owner": "root:root"}
            for path, content in sorted(private_files.items())
        )
    if mounts:
        config["mounts"] = [[*mount, "0", "0"] for mount in mounts]
    if commands:
        config["runcmd"] = [list(command) for command in commands]
    return "#cloud-config\n" + yaml.dump(config, Dumper=_Dumper, sort_keys=False)


def _default_route(gateway: str) -> str:
    return "0.0.0.0/0" if ipaddress.ip_address(gateway).version == 4 else "::/0"


def network_config(nics: Sequence[GuestNic]) -> str:
    """Netplan version 2 for ``nics`` ("" when there are none).

    NIC ``n`` (its place in ``nics``) is matched by its MAC and renamed ``ens-<n>``, so the
    guest's names follow the order given whatever PCI slot each NIC got; it gets its MTU,
    its static addresses and its DNS servers. Only the first NIC with a gateway gets a
    default route (via that gateway), so a guest has one default route whatever the rest.
    """
    if not nics:
        return ""
    ethernets = {}
    routed = False
    for index, nic in enumerate(nics):
        name = f"{NIC_NAME_PREFIX}{index}"
        config: dict = {"match": {"macaddress": nic.mac}, "set-name": name, "mtu": nic.mtu}
        if nic.addresses:
            config["addresses"] = list(nic.addresses)
        if nic.gateway and not routed:
            config["routes"] = [{"to": _default_route(nic.gateway), "via": nic.gateway}]
            routed = True
        if nic.dns:
            config["nameservers"] = {"addresses": list(nic.dns)}
            if nic.search:
                config["nameservers"]["search"] = list(nic.search)
        ethernets[name] = config
    return yaml.safe_dump({"version": 2, "ethernets": ethernets}, sort_keys=False)


def _contents(
    instance_id, hostname, ssh_keys, user_data, files, nics, mounts, private_files=None,
    commands=(),
) -> dict[str, str]:  # fmt: skip
    contents = {
        "meta-data": meta_data(instance_id=instance_id, hostname=hostname, ssh_keys=ssh_keys),
        "user-data": user_data,
        "vendor-data": vendor_data(files or {}, mounts, private_files, commands),
        "network-config": network_config(nics),
    }
    return {name: text for name, text in contents.items() if text or name not in _OPTIONAL}


def _iso(contents: Mapping[str, str]) -> bytes:
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=VOLUME_LABEL)
    try:
        for iso_name, name in _FILES:
            if name not in contents:
                continue
            data = contents[name].encode()
            iso.add_fp(
                io.BytesIO(data),
                len(data),
                f"/{iso_name}",
                rr_name=name,
                joliet_path=f"/{name}",
            )
        out = io.BytesIO()
        iso.write_fp(out)
    finally:
        iso.close()
    return out.getvalue()


def read_seed(path: str | Path) -> dict[str, str]:
    """The files of a seed ISO by their cloud-init names, as a guest would read them
    (through the Rock Ridge names), and its volume ``label``; an optional file the seed
    lacks is left out. For checks and diagnostics."""
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        found = {}
        for _iso_name, name in _FILES:
            out = io.BytesIO()
            try:
                iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
            except PyCdlibInvalidInput:
                if name in _OPTIONAL:
                    continue
                raise
            found[name] = out.getvalue().decode()
        found["label"] = iso.pvd.volume_identifier.decode().strip()
        return found
    finally:
        iso.close()


def _same(path: Path, contents: Mapping[str, str]) -> bool:
    try:
        found = read_seed(path)
    except Exception:  # a torn or foreign file: rewrite it
        return False
    return found == {**contents, "label": VOLUME_LABEL}


def write_seed(
    path: str | Path,
    *,
    instance_id: str,
    hostname: str,
    ssh_keys: Sequence[str] = (),
    user_data: str = "",
    files: Mapping[str, str] | None = None,
    nics: Sequence[GuestNic] = (),
    mounts: Sequence[Sequence[str]] = (),
    private_files: Mapping[str, str] | None = None,
    commands: Sequence[Sequence[str]] = (),
) -> Path:
    """Write the seed to ``path`` (its folder is made) and return the path. Idempotent: an
    existing seed with the same files (no more, no fewer) is left untouched; otherwise it is
    replaced atomically, so a guest never reads a half-written seed. ``nics`` become its
    ``network-config``; ``mounts`` and ``commands`` go into its vendor data."""
    path = Path(path)
    contents = _contents(
        instance_id, hostname, ssh_keys, user_data, files, nics, mounts, private_files, commands
    )
    if path.exists() and _same(path, contents):
        return path
    data = _iso(contents)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
