"""A simulated data-centre network for simulated hosts: each host gets a network namespace
(``kumo-sim-<host>``) with an underlay link ``ul0`` on a shared underlay bridge (in namespace
``kumo-sim-fabric``); the gateway host also gets an external bridge ``brx`` joined to namespace
``kumo-sim-ext``, which stands for the outside world at ``EXTERNAL_GATEWAY``.

Host agents of simulated hosts converge their namespace exactly as a real host's agent
converges the host itself, so ``make run`` and the end-to-end tests exercise the real
network driver. Needs root and iproute2. ``ensure`` is idempotent (a second call changes
nothing); ``remove`` takes every namespace of the fabric away.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

FABRIC, EXTERNAL = "fabric", "ext"
UNDERLAY_PREFIX = "10.250.0"
EXTERNAL_CIDR, EXTERNAL_GATEWAY = "198.51.100.0/24", "198.51.100.1"


@dataclass(frozen=True)
class SimHost:
    """How one simulated host's agent is configured (its ``--network-*`` options)."""

    name: str
    netns: str
    vtep: str
    gateway: bool

    def agent_args(self) -> list[str]:
        args = [
            "--network-netns", self.netns,
            "--network-vtep", self.vtep,
            "--network-underlay-device", "ul0",
        ]  # fmt: skip
        if self.gateway:
            args += ["--network-gateway", "--network-external-bridge", "brx"]
        return args


def available() -> bool:
    """Whether this process may build the fabric (root, iproute2)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def netns(name: str, prefix: str = "kumo-sim") -> str:
    return f"{prefix}-{name}"


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=check, timeout=30)


def _exists(namespace: str) -> bool:
    return os.path.exists(f"/run/netns/{namespace}")


def _ensure_netns(namespace: str) -> bool:
    """Create ``namespace`` with loopback up; False when it was there already."""
    if _exists(namespace):
        return False
    _ip("netns", "add", namespace)
    _ip("-n", namespace, "link", "set", "lo", "up")
    return True


def ensure(hosts: list[str], *, gateway: str = "", prefix: str = "kumo-sim") -> list[SimHost]:
    """Build (or find) the fabric for ``hosts``; ``gateway`` (default: the last host)
    runs the project routers. Host i (from 1) has VTEP ``10.250.0.<i>``."""
    gateway = gateway or (hosts[-1] if hosts else "")
    fabric = netns(FABRIC, prefix)
    if _ensure_netns(fabric):
        _ip("-n", fabric, "link", "add", "ul", "type", "bridge")
        _ip("-n", fabric, "link", "set", "ul", "up")
    result = []
    for i, host in enumerate(hosts, start=1):
        namespace, vtep = netns(host, prefix), f"{UNDERLAY_PREFIX}.{i}"
        if _ensure_netns(namespace):
            peer = f"ul{i}"
            _ip("-n", namespace, "link", "add", "ul0", "type", "veth", "peer", "name", peer,
                "netns", fabric)  # fmt: skip
            _ip("-n", fabric, "link", "set", peer, "master", "ul", "up")
            _ip("-n", namespace, "addr", "add", f"{vtep}/24", "dev", "ul0")
            _ip("-n", namespace, "link", "set", "ul0", "up")
        if host == gateway:
            _ensure_external(namespace, netns(EXTERNAL, prefix))
        result.append(SimHost(name=host, netns=namespace, vtep=vtep, gateway=host == gateway))
    return result


def _ensure_external(host_ns: str, external: str) -> None:
    if _ip("-n", host_ns, "link", "show", "brx", check=False).returncode == 0:
        return
    _ensure_netns(external)
    _ip("-n", host_ns, "link", "add", "brx", "type", "bridge")
    _ip("-n", host_ns, "link", "set", "brx", "up")
    _ip("-n", host_ns, "link", "add", "xo", "type", "veth", "peer", "name", "eth0",
        "netns", external)  # fmt: skip
    _ip("-n", host_ns, "link", "set", "xo", "master", "brx", "up")
    _ip("-n", external, "addr", "add", f"{EXTERNAL_GATEWAY}/24", "dev", "eth0")
    _ip("-n", external, "link", "set", "eth0", "up")


def remove(hosts: list[str], *, prefix: str = "kumo-sim") -> None:
    """Delete the fabric's namespaces (router namespaces the agents made are the agents' to
    remove: resync each host to nothing first)."""
    for name in [*hosts, EXTERNAL, FABRIC]:
        _ip("netns", "del", netns(name, prefix), check=False)
