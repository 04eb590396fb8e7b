"""One real guest booted under KVM through ``LibvirtDriver`` on ``qemu:///system``: the code
path that simulated hosts exercise on libvirt's test driver, proven on a real hypervisor.

Opt-in: it runs only with ``KUMO_TEST_KVM=1`` on a prepared host (``make kvm-host``) and
skips with the reason otherwise, so CI and ``make test`` never need KVM.

The guest is Debian's kernel (``/boot/vmlinuz-*``) booted directly with a tiny initramfs built
here from busybox-static: no disk, no network, 256 MiB and one vCPU. Its ``/init`` reads a
token from the kernel command line and prints ``KUMO-BOOT-OK <token>`` to the serial console
every half second, so the line proves the kernel, initramfs and command line all arrived, and
printing it repeatedly makes the check independent of when the console reader attaches (a
pty console drops output nobody reads). The guest powers itself off after about two minutes
in case a crashed run leaves it behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import struct
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from compute.drivers import domain_xml
from compute.drivers.base import GuestNotFound, GuestSpec, GuestState, PowerState
from controlplane.agent.config import AgentConfig

pytestmark = pytest.mark.kvm

URI = "qemu:///system"
VM_ID = "kvm-boot-test"  # fixed, so a run cleans up what a crashed earlier run left behind
BUSYBOX = Path(os.environ.get("KUMO_TEST_KVM_BUSYBOX", "/bin/busybox"))
MARKER = "KUMO-BOOT-OK"
BOOT_TIMEOUT_S = 40.0

INIT_SCRIPT = f"""#!/bin/sh
bb=/bin/busybox
$bb mount -t proc proc /proc
read -r cmdline < /proc/cmdline
token=none
for word in $cmdline; do
  case "$word" in kumo.marker=*) token="${{word#kumo.marker=}}" ;; esac
done
i=0
while [ $i -lt 240 ]; do
  echo "{MARKER} $token"
  $bb sleep 0.5
  i=$((i + 1))
done
$bb poweroff -f
"""


def _kernel() -> Path | None:
    """``KUMO_TEST_KVM_KERNEL``, else the newest Debian kernel in /boot."""
    if override := os.environ.get("KUMO_TEST_KVM_KERNEL"):
        return Path(override)
    kernels = sorted(Path("/boot").glob("vmlinuz-*"), key=lambda p: p.stat().st_mtime)
    return kernels[-1] if kernels else None


def _is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a program interpreter (no dynamic loader needed)."""
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only: what x86-64 busybox is
            return False
        (phoff,) = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    pt_interp = 3
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != pt_interp for i in range(phnum))


def _skip_reason() -> str | None:
    if os.environ.get("KUMO_TEST_KVM") != "1":
        return "real-KVM test is opt-in: set KUMO_TEST_KVM=1 (after `make kvm-host`)"
    if not os.path.exists("/dev/kvm"):
        return "no /dev/kvm on this machine"
    kernel = _kernel()
    if kernel is None or not kernel.is_file():
        return "no kernel to boot: /boot/vmlinuz-* missing (`make kvm-host` installs one)"
    if not BUSYBOX.is_file() or not _is_static_elf(BUSYBOX):
        return f"{BUSYBOX} missing or not static (`make kvm-host` installs busybox-static)"
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        libvirt.open(URI).close()
    except libvirt.libvirtError as exc:
        return f"libvirt {URI} does not answer ({exc}); `make kvm-host` starts libvirtd"
    return None


# -- initramfs ------------------------------------------------------------------------------


def _cpio_newc(entries: list[tuple[str, int, bytes, tuple[int, int]]]) -> bytes:
    """An uncompressed ``newc`` cpio archive (what the kernel unpacks as initramfs) from
    ``(name, mode, data, (rdev_major, rdev_minor))`` entries. Written here rather than with
    cpio(1) so the device node needs no mknod and the host needs no cpio."""
    out = bytearray()
    trailer = ("TRAILER!!!", 0, b"", (0, 0))
    for ino, (name, mode, data, (major, minor)) in enumerate([*entries, trailer], start=1):
        raw_name = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, major, minor, len(raw_name), 0)
        out += b"070701" + "".join(f"{field:08x}" for field in fields).encode() + raw_name
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def build_initramfs(path: Path) -> None:
    """busybox, ``/init`` and a ``/dev/console`` node (the kernel opens it before ``/init``
    runs; without it ``/init`` has no output)."""
    directory, regular, executable = 0o040755, 0o100644, 0o100755
    entries = [
        ("bin", directory, b"", (0, 0)),
        ("dev", directory, b"", (0, 0)),
        ("proc", directory, b"", (0, 0)),
        ("bin/busybox", executable, BUSYBOX.read_bytes(), (0, 0)),
        ("bin/sh", 0o120777, b"busybox", (0, 0)),  # symlink, for the #! line
        ("dev/console", 0o020600, b"", (5, 1)),
        ("init", executable, INIT_SCRIPT.encode(), (0, 0)),
        ("etc", directory, b"", (0, 0)),
        ("etc/hostname", regular, b"kumo-kvm-test\n", (0, 0)),
    ]
    path.write_bytes(_cpio_newc(entries))


# -- serial console -------------------------------------------------------------------------


def _console_log_file(live_xml: str) -> str | None:
    """Where the guest's serial output is written to a file, if the domain says so
    (``<serial type='file'>`` or a chardev ``<log file=…>``); ``None`` for a bare pty."""
    root = ET.fromstring(live_xml)
    for dev in [*root.iterfind("devices/serial"), *root.iterfind("devices/console")]:
        log = dev.find("log")
        if log is not None and log.get("file"):
            return log.get("file")
        source = dev.find("source")
        if dev.get("type") == "file" and source is not None and source.get("path"):
            return source.get("path")
    return None


def wait_for_console(vm_id: str, needle: str, timeout_s: float) -> tuple[bool, str]:
    """Read the guest's serial console until ``needle`` appears or ``timeout_s`` passes;
    return (found, what was read). Uses a separate libvirt connection: the driver under test
    has no console API, and this test must not reach into it. A file-backed console is read
    from its file; a pty console through libvirt's console stream (``virsh console``)."""
    import libvirt

    conn = libvirt.open(URI)
    deadline = time.monotonic() + timeout_s
    seen = b""
    try:
        dom = conn.lookupByName(domain_xml.domain_name(vm_id))
        log_file = _console_log_file(dom.XMLDesc(0))
        if log_file is not None:
            while time.monotonic() < deadline:
                seen = Path(log_file).read_bytes() if os.path.exists(log_file) else b""
                if needle.encode() in seen:
                    return True, seen.decode(errors="replace")
                time.sleep(0.2)
            return False, seen.decode(errors="replace")
        stream = conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        dom.openConsole(None, stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
        try:
            while time.monotonic() < deadline:
                data = stream.recv(4096)
                if data == -2:  # nothing yet
                    time.sleep(0.05)
                    continue
                if not data:  # console closed: the guest went away
                    break
                seen += data
                if needle.encode() in seen:
                    return True, seen.decode(errors="replace")
        finally:
            with contextlib.suppress(libvirt.libvirtError):
                stream.abort()
        return False, seen.decode(errors="replace")
    finally:
        conn.close()


def _qemu_log_tail(vm_id: str, lines: int = 20) -> str:
    path = Path(f"/var/log/libvirt/qemu/{domain_xml.domain_name(vm_id)}.log")
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- the test -------------------------------------------------------------------------------


@pytest.fixture
def kvm_driver():
    if reason := _skip_reason():
        pytest.skip(reason)
    from compute.drivers.libvirt import LibvirtDriver

    # The agent's own settings: KUMO_GUEST_CPU_MODE / KUMO_GUEST_CPU_DISABLE (nested hosts).
    config = AgentConfig.from_env(host="kvm-test")
    driver = LibvirtDriver(
        URI, cpu_mode=config.guest_cpu_mode, cpu_disable=config.guest_cpu_disable
    )
    driver.ensure_absent(VM_ID)  # left over from a crashed run
    try:
        yield driver
    finally:
        driver.ensure_absent(VM_ID)
        driver.close()


@pytest.fixture
def boot_files():
    """Kernel and initramfs in a folder QEMU's user (libvirt-qemu) can read: libvirt labels
    the files themselves, but not the folders above them (pytest's tmp_path is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="kumo-kvm-"))
    try:
        folder.chmod(0o755)
        kernel = _kernel()
        assert kernel is not None
        initrd = folder / "initramfs.cpio"
        build_initramfs(initrd)
        yield kernel, initrd
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_real_guest_boots_and_is_cleaned_up(kvm_driver, boot_files):
    kernel, initrd = boot_files
    token = secrets.token_hex(6)
    spec = GuestSpec(
        vm_id=VM_ID,
        generation=1,
        name="Kumo real-KVM boot test",
        vcpus=1,
        memory_mib=256,
        kernel=str(kernel),
        initrd=str(initrd),
        cmdline=f"console=ttyS0 kumo.marker={token}",
    )

    started = time.monotonic()
    assert kvm_driver.ensure_defined(spec) == GuestState(VM_ID, 1, PowerState.SHUTOFF)
    defined = ET.fromstring(kvm_driver.domain_xml(VM_ID))
    assert defined.findtext("os/kernel") == str(kernel)
    assert defined.findtext("os/initrd") == str(initrd)
    assert defined.findtext("os/cmdline") == spec.cmdline

    assert kvm_driver.ensure_running(VM_ID).power is PowerState.RUNNING
    running_after = time.monotonic() - started

    found, console = wait_for_console(VM_ID, f"{MARKER} {token}", BOOT_TIMEOUT_S)
    assert found, (
        f"no '{MARKER} {token}' on the serial console within {BOOT_TIMEOUT_S:.0f} s.\n"
        f"--- console (last 3000 chars) ---\n{console[-3000:]}\n"
        f"--- qemu log ---\n{_qemu_log_tail(VM_ID)}"
    )
    booted_after = time.monotonic() - started

    assert kvm_driver.get_guest(VM_ID) == GuestState(VM_ID, 1, PowerState.RUNNING)
    assert kvm_driver.ensure_running(VM_ID).power is PowerState.RUNNING  # a repeat: no-op
    assert [g.vm_id for g in kvm_driver.list_guests()].count(VM_ID) == 1

    # busybox's /init runs no ACPI daemon, so the graceful request goes unanswered and the
    # driver forces the guest off after the grace period: both halves of ensure_stopped.
    stopped = kvm_driver.ensure_stopped(VM_ID, graceful_timeout_s=1.0)
    assert stopped == GuestState(VM_ID, 1, PowerState.SHUTOFF)
    kvm_driver.ensure_absent(VM_ID)
    with pytest.raises(GuestNotFound):
        kvm_driver.get_guest(VM_ID)
    assert VM_ID not in [g.vm_id for g in kvm_driver.list_guests()]

    print(
        f"kvm boot: running after {running_after:.2f} s, marker after {booted_after:.2f} s, "
        f"whole test body {time.monotonic() - started:.2f} s"
    )
