"""Which accelerator a real host's guests run on: KVM, or QEMU's TCG (pure emulation).

An agent on ``qemu:///system`` reads ``KUMO_GUEST_ACCEL`` (``auto``, the default, ``kvm``
or ``tcg``) once at start and reports what it resolved with its inventory, so the
controller (and the host's API page) says how this host's guests run.

``auto`` chooses KVM only where KVM can boot an ordinary guest kernel, decided cheaply and
without starting a guest:

- ``/dev/kvm`` missing or not openable read-write: TCG;
- KVM provided by ``kvm_pvm`` alone (``/sys/module/kvm_pvm`` present, neither ``kvm_intel``
  nor ``kvm_amd``): TCG. PVM is a software KVM for hosts that are themselves VMs without
  hardware virtualisation (no ``vmx``/``svm`` CPU flag); it runs only guest kernels built
  as PVM guests, and a stock Debian kernel hangs right after decompression under it (see
  docs/operator/real-hosts.md for what was tried). That is the case on the machines these
  tests run on;
- otherwise KVM.

``kvm`` forces KVM (the agent refuses to start guests nowhere: libvirt then reports its own
error at the first start); ``tcg`` forces emulation, which boots anything, slowly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SETTINGS = ("auto", "kvm", "tcg")


@dataclass(frozen=True)
class Accel:
    accel: str  # "kvm" or "tcg"
    reason: str  # why, in one line, for logs and the operator

    @property
    def domain_type(self) -> str:
        """libvirt's ``<domain type>``: ``kvm``, or ``qemu`` for TCG."""
        return "kvm" if self.accel == "kvm" else "qemu"


def _kvm_openable(dev: Path) -> bool:
    try:
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def resolve(setting: str, *, dev: Path = Path("/dev/kvm"), sys_module: Path = Path("/sys/module")):
    """The accelerator for ``setting`` (one of ``SETTINGS``; ``ValueError`` otherwise)."""
    setting = (setting or "auto").strip().lower()
    if setting not in SETTINGS:
        raise ValueError(f"KUMO_GUEST_ACCEL must be one of {', '.join(SETTINGS)}, not {setting!r}")
    if setting == "kvm":
        return Accel("kvm", "KUMO_GUEST_ACCEL=kvm")
    if setting == "tcg":
        return Accel("tcg", "KUMO_GUEST_ACCEL=tcg")
    if not _kvm_openable(dev):
        return Accel("tcg", f"auto: {dev} is missing or cannot be opened")
    hardware = any((sys_module / name).exists() for name in ("kvm_intel", "kvm_amd"))
    if (sys_module / "kvm_pvm").exists() and not hardware:
        return Accel("tcg", "auto: KVM here is kvm_pvm, which boots only PVM-enabled guest kernels")
    return Accel("kvm", f"auto: {dev} works")
