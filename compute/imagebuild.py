"""Kumo's own guest image: a small Debian 12 cloud image built from Debian's archive.

``build_image()`` (``manage.py image-build``, ``make image``) makes a qcow2 that boots under
libvirt/QEMU from the disk alone, as any image a user uploads must:

- the root file system is a Debian 12 ``minbase`` made by ``mmdebstrap`` from Debian's
  package archive (nothing downloaded from anywhere else), with the cloud kernel,
  cloud-init (NoCloud only: the seed ISO Kumo writes), openssh-server (password login off;
  cloud-init's default user ``debian`` gets the user's key), systemd-networkd and -resolved
  (cloud-init renders Kumo's netplan v2 network-config for networkd), udev and growpart;
- the disk is made without loop devices or mounts, so it builds in a container or a CI
  runner as well: the ext4 root is written from the directory with ``mke2fs -d``, the boot
  partition is a FAT file system written with mtools holding the kernel, its initramfs and
  SYSLINUX (``syslinux --install`` works on an image file), the partition table is written
  with ``sfdisk`` on the disk file, SYSLINUX's MBR code with ``dd``, and each partition is
  copied in at its offset. See docs/architecture/guest-image.md for why this shape.

The result is cached by the SHA-256 of its recipe (this file, which holds the package list
and every script, and the versions of the tools that write the disk), in
``KUMO_IMAGE_CACHE`` (default ``/var/cache/kumo/images`` for root), so CI and repeated runs
reuse it: a build only happens when the recipe changed. Writing is atomic (a partial file is renamed
into place only when complete). This module does not import Django; registering the image
is the management command's business.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
MIRRORS = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
PACKAGES = (
    "linux-image-cloud-amd64",
    "initramfs-tools",
    "systemd-sysv",
    "udev",
    "systemd-resolved",
    "dbus",  # networkd, resolved and hostnamed talk over it
    "cloud-init",
    "cloud-guest-utils",  # growpart: the root partition grows to the VM's disk
    "fdisk",  # sfdisk, which growpart drives
    "openssh-server",
    "sudo",
    "iproute2",
    "iputils-ping",
    "netbase",
    "e2fsprogs",
    "python3",
)
# The tools whose output ends up in the disk: their versions are part of the recipe.
TOOLS = ("mmdebstrap", "mke2fs", "mkfs.fat", "mcopy", "syslinux", "sfdisk", "qemu-img")
DISK_GIB = 2
BOOT_MIB = 64
BOOT_START_SECTOR = 2048
ROOT_LABEL = "kumo-root"
# A device may take minutes to show up while udev coldplugs under TCG on a busy host: the
# serial getty waits for ttyS0 rather than giving up after systemd's default 90 s.
KERNEL_CMDLINE = (
    "ro console=ttyS0,115200n8 net.ifnames=0 quiet systemd.default_device_timeout_sec=600"
)

# Run inside mmdebstrap's customize hook: "$1" is the root directory.
CUSTOMIZE = r"""
set -eu
root="$1"
# cloud-init: NoCloud only (Kumo's seed ISO), networkd renders the network-config.
cat > "$root/etc/cloud/cloud.cfg.d/90-kumo.cfg" <<'EOF'
datasource_list: [NoCloud, None]
system_info:
  network:
    renderers: [networkd]
    activators: [networkd]
ssh_pwauth: false
disable_root: true
# The one locale every Debian system has (libc's C.UTF-8); en_US.UTF-8 is not generated.
locale: C.UTF-8
EOF
# No password login over SSH, ever; keys only.
mkdir -p "$root/etc/ssh/sshd_config.d"
cat > "$root/etc/ssh/sshd_config.d/90-kumo.conf" <<'EOF'
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
EOF
# The host keys are made per instance by cloud-init at first boot.
rm -f "$root"/etc/ssh/ssh_host_*
# A fresh machine id per instance.
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
# Networking: networkd + resolved; waiting for the network never holds boot for long.
chroot "$root" systemctl enable systemd-networkd.service systemd-resolved.service
mkdir -p "$root/etc/systemd/system/systemd-networkd-wait-online.service.d"
cat > "$root/etc/systemd/system/systemd-networkd-wait-online.service.d/kumo.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=20
EOF
# Nothing the first boot does not need.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
            fstrim.timer man-db.timer; do
  chroot "$root" systemctl disable "$unit" 2>/dev/null || true
done
cat > "$root/etc/fstab" <<EOF
LABEL=__ROOT_LABEL__ / ext4 defaults,errors=remount-ro 0 1
EOF
# A small initramfs that finds a virtio root and loads, before udev's coldplug, what
# cloud-init's first stage needs: the SATA CD-ROM with the seed and the virtio NIC.
cat > "$root/etc/initramfs-tools/conf.d/kumo.conf" <<'EOF'
MODULES=list
COMPRESS=zstd
EOF
printf '%s\n' virtio_pci virtio_blk virtio_scsi sd_mod ext4 crc32c_generic ahci sr_mod \
  cdrom isofs virtio_net \
  > "$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all
apt-get -o Dir="$root" clean 2>/dev/null || true
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* \
       "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log
"""

SYSLINUX_CFG = """DEFAULT kumo
PROMPT 0
TIMEOUT 0
LABEL kumo
  KERNEL /vmlinuz
  INITRD /initrd.img
  APPEND root=UUID={uuid} {cmdline}
"""


@dataclass(frozen=True)
class BuiltImage:
    path: Path
    checksum: str  # sha256:<hex> of the qcow2 file
    size_bytes: int
    recipe: str  # the recipe hash (hex), the cache key
    cached: bool  # True when no build was needed


def cache_dir() -> Path:
    """``KUMO_IMAGE_CACHE``, else ``/var/cache/kumo/images`` for root (QEMU, running as
    ``libvirt-qemu``, must reach the file as an overlay's backing image, and ``/root`` is
    closed to it), else ``$XDG_CACHE_HOME/kumo/images`` (``~/.cache/...``)."""
    if os.environ.get("KUMO_IMAGE_CACHE"):
        return Path(os.environ["KUMO_IMAGE_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/kumo/images")
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kumo" / "images"


def _tool_version(tool: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if not path:
        return "missing"
    for flag in ("--version", "-V"):
        try:
            out = subprocess.run(
                [path, flag], capture_output=True, text=True, timeout=20, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = (out.stdout + out.stderr).strip().splitlines()
        if text:
            return text[0]
    return "unknown"


def recipe_hash() -> str:
    """The cache key: this file (packages, scripts, layout) and the tools' versions."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for tool in TOOLS:
        digest.update(f"\n{tool}={_tool_version(tool)}".encode())
    return digest.hexdigest()


def image_name(recipe: str) -> str:
    return f"debian-12-kumo-{recipe[:12]}.qcow2"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def cached_image() -> BuiltImage | None:
    """The cached image for today's recipe, or None when it must be built."""
    recipe = recipe_hash()
    path = cache_dir() / image_name(recipe)
    sums = path.with_suffix(".sha256")
    if not path.exists() or not sums.exists():
        return None
    return BuiltImage(path, sums.read_text().strip(), path.stat().st_size, recipe, True)


def _run(*args, **kwargs):
    subprocess.run([str(a) for a in args], check=True, **kwargs)


def build_image(*, log=print) -> BuiltImage:
    """The image for today's recipe: the cached one, else built now (needs root, for
    mmdebstrap's chroot; takes a few minutes and about 1.5 GiB of scratch space)."""
    found = cached_image()
    if found:
        return found
    recipe = recipe_hash()
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / image_name(recipe)
    root_uuid = str(uuid.UUID(recipe[:32]))
    with tempfile.TemporaryDirectory(prefix="kumo-image-", dir=out_dir) as scratch:
        work = Path(scratch)
        rootdir = work / "root"
        hook = work / "customize.sh"
        hook.write_text(CUSTOMIZE.replace("__ROOT_LABEL__", ROOT_LABEL))
        log(f"image-build: mmdebstrap {SUITE} into {rootdir}")
        _run(
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            "--include=" + ",".join(PACKAGES),
            "--aptopt=Acquire::Retries 3",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            f'--customize-hook=sh {hook} "$1"',
            SUITE,
            rootdir,
            *MIRRORS,
        )
        # mmdebstrap puts back the host's resolv.conf and hostname: the guest's own now.
        (rootdir / "etc/resolv.conf").unlink(missing_ok=True)
        (rootdir / "etc/resolv.conf").symlink_to("../run/systemd/resolve/stub-resolv.conf")
        (rootdir / "etc/hostname").write_text("localhost\n")
        boot = rootdir / "boot"
        kernel = sorted(boot.glob("vmlinuz-*"))[-1]
        initrd = sorted(boot.glob("initrd.img-*"))[-1]
        # The boot partition: FAT with the kernel, initramfs and SYSLINUX, no mount.
        boot_img = work / "boot.img"
        cfg = work / "syslinux.cfg"
        cfg.write_text(SYSLINUX_CFG.format(uuid=root_uuid, cmdline=KERNEL_CMDLINE))
        _run(
            "mkfs.fat", "-n", "KUMOBOOT", "-h", BOOT_START_SECTOR,
            "-C", boot_img, BOOT_MIB * 1024,
        )  # fmt: skip
        _run("mcopy", "-i", boot_img, kernel, "::/vmlinuz")
        _run("mcopy", "-i", boot_img, initrd, "::/initrd.img")
        _run("mcopy", "-i", boot_img, cfg, "::/syslinux.cfg")
        # The root partition: ext4 written from the directory.
        disk_bytes = DISK_GIB << 30
        root_start = BOOT_START_SECTOR + BOOT_MIB * 2048
        root_sectors = disk_bytes // 512 - root_start
        root_img = work / "root.img"
        log("image-build: mke2fs -d")
        _run(
            "mke2fs", "-q", "-t", "ext4", "-L", ROOT_LABEL, "-U", root_uuid,
            "-E", "lazy_itable_init=1,lazy_journal_init=1", "-d", rootdir,
            root_img, f"{root_sectors // 2}k",
        )  # fmt: skip
        # The disk: MBR table, SYSLINUX's MBR code, both partitions at their offsets.
        raw = work / "disk.raw"
        with open(raw, "wb") as f:
            f.truncate(disk_bytes)
        table = (
            "label: dos\n"
            f"start={BOOT_START_SECTOR}, size={BOOT_MIB * 2048}, type=c, bootable\n"
            f"start={root_start}, type=83\n"
        )
        _run("sfdisk", "-q", raw, input=table.encode())
        _run("dd", "if=/usr/lib/syslinux/mbr/mbr.bin", f"of={raw}", "bs=440", "count=1",
             "conv=notrunc", "status=none")  # fmt: skip
        for part, start in ((boot_img, BOOT_START_SECTOR), (root_img, root_start)):
            _run("dd", f"if={part}", f"of={raw}", "bs=1M", f"seek={start * 512}",
                 "oflag=seek_bytes", "conv=notrunc,sparse", "status=none")  # fmt: skip
        # SYSLINUX into the FAT where it now lies (it records where ldlinux.sys sits).
        _run("syslinux", "--install", "--offset", BOOT_START_SECTOR * 512, raw)
        partial = work / "image.qcow2"
        _run("qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, partial)
        checksum = sha256_file(partial)
        os.chmod(partial, 0o644)
        os.replace(partial, target)
        target.with_suffix(".sha256").write_text(checksum + "\n")
    log(f"image-build: {target} {checksum}")
    return BuiltImage(target, checksum, target.stat().st_size, recipe, False)
