"""The console log and the hard reset on a real QEMU guest under libvirtd, through
``LibvirtDriver`` (the agent's driver) and the agent's console-log task.

The guest is the busybox-initramfs guest of ``test_kvm_boot.py`` (Debian's kernel booted
directly, no disk, no network), run under QEMU's TCG (``<domain type='qemu'>``: nested KVM
hangs on these machines), so it needs libvirtd (``make kvm-host``), a kernel in /boot and
busybox-static, and skips with the reason otherwise. Its ``/init`` prints a boot line with
a per-run token once per boot, so the log shows one line per boot. About 15 s.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from compute import host_tasks
from compute.drivers.base import GuestSpec, PowerState
from controlplane.agent import reports, runtime
from controlplane.agent.config import AgentConfig
from tests.compute.test_kvm_boot import BUSYBOX, URI, _cpio_newc, _is_static_elf, _kernel

pytestmark = pytest.mark.kvm_tcg

MARKER = "KUMO-CONSOLE-BOOT"
INIT = f"""#!/bin/sh
bb=/bin/busybox
$bb mount -t proc proc /proc
read -r cmdline < /proc/cmdline
for word in $cmdline; do
  case "$word" in kumo.marker=*) token="${{word#kumo.marker=}}" ;; esac
done
echo "{MARKER} $token"
$bb sleep 120
$bb poweroff -f
"""


def _skip_reason() -> str | None:
    kernel = _kernel()
    if kernel is None or not kernel.is_file():
        return "no kernel to boot: /boot/vmlinuz-* missing (`make kvm-host` installs one)"
    if not BUSYBOX.is_file() or not _is_static_elf(BUSYBOX):
        return f"{BUSYBOX} missing or not static (`make kvm-host` installs busybox-static)"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed"
    import libvirt

    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        libvirt.open(URI).close()
    except libvirt.libvirtError as exc:
        return f"libvirt {URI} does not answer ({exc}); `make kvm-host` starts libvirtd"
    return None


@pytest.fixture
def guest():
    """A defined guest spec whose console logs into a folder QEMU's helpers can reach, the
    TCG driver, and the agent configured with that folder as its instances folder."""
    if reason := _skip_reason():
        pytest.skip(reason)
    from compute.drivers.libvirt import LibvirtDriver

    folder = Path(tempfile.mkdtemp(prefix="kumo-console-"))
    folder.chmod(0o755)
    vm_id = f"console-test-{secrets.token_hex(4)}"
    initrd = folder / "initramfs.cpio"
    directory, executable = 0o040755, 0o100755
    initrd.write_bytes(
        _cpio_newc(
            [
                ("bin", directory, b"", (0, 0)),
                ("dev", directory, b"", (0, 0)),
                ("proc", directory, b"", (0, 0)),
                ("bin/busybox", executable, BUSYBOX.read_bytes(), (0, 0)),
                ("bin/sh", 0o120777, b"busybox", (0, 0)),
                ("dev/console", 0o020600, b"", (5, 1)),
                ("init", executable, INIT.encode(), (0, 0)),
            ]
        )
    )
    driver = LibvirtDriver(URI, poll_interval_s=0.05, cpu_mode="maximum")
    driver._domain_type = "qemu"  # TCG: nested KVM hangs on these machines (HOST-SETUP.md)
    runtime.configure(AgentConfig.from_env(host="console-test", instances_dir=folder))
    token = secrets.token_hex(6)
    spec = GuestSpec(
        vm_id=vm_id,
        generation=1,
        name="Kumo console test",
        vcpus=1,
        memory_mib=256,
        kernel=str(_kernel()),
        initrd=str(initrd),
        cmdline=f"console=ttyS0 quiet kumo.marker={token}",
        console_log=str(folder / vm_id / "console.log"),
    )
    (folder / vm_id).mkdir()
    try:
        yield driver, spec, token
    finally:
        driver.ensure_absent(vm_id)
        driver.close()
        runtime.configure(None)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for(driver, vm_id: str, needle: str, count: int, timeout_s: float = 150) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = driver.console_log(vm_id).decode(errors="replace")
        if text.count(needle) >= count:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} x{count} not in the console log:\n{text[-3000:]}")


def test_console_log_shows_the_guest_and_reset_reboots_it(guest, monkeypatch):
    driver, spec, token = guest
    driver.ensure_defined(spec)
    assert driver.ensure_running(spec.vm_id).power is PowerState.RUNNING

    _wait_for(driver, spec.vm_id, f"{MARKER} {token}", 1)
    # The agent's task answers through the operation result path with the same tail.
    sent = []
    monkeypatch.setattr(host_tasks, "driver", lambda: driver)
    monkeypatch.setattr(reports, "send", lambda host, kind, payload: sent.append(payload))
    host_tasks.vm_console_log(vm_id=spec.vm_id, operation_id="op-1", max_bytes=4096)
    (answer,) = sent
    assert answer["ok"] and answer["operation_id"] == "op-1"
    assert len(answer["result"]["output"].encode()) <= 4096
    assert answer["result"]["bytes"] <= 4096

    # A hard reset: the guest boots again at once (a second boot line), same domain.
    assert driver.reset(spec.vm_id).power is PowerState.RUNNING
    _wait_for(driver, spec.vm_id, f"{MARKER} {token}", 2)

    # Power-off: off at once, no grace asked for (busybox would ignore ACPI anyway).
    started = time.monotonic()
    assert driver.power_off(spec.vm_id).power is PowerState.SHUTOFF
    assert time.monotonic() - started < 5
    # The log survives the guest being off.
    assert f"{MARKER} {token}" in driver.console_log(spec.vm_id).decode()
