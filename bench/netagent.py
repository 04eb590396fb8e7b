"""The host network agent converging many networks, beside ``ip -batch`` doing the same work.

Needs root (network namespaces). In a fresh namespace with an underlay veth, the driver
(``network.drivers.linux.LinuxNetworkDriver.resync``) converges NETWORKS overlay networks
from nothing: per network a VXLAN device (VNI, local VTEP, learning off) and a bridge, the
VXLAN device on the bridge, both up, and one static FDB entry for a remote VTEP. Then it
resyncs again with nothing to change, counting netlink writes. The reference, in a second
fresh namespace in the same run: ``ip -batch`` and ``bridge -batch`` making the same devices,
links and FDB entries from a prepared command file.

Prints progress on stderr and one JSON line, last, on stdout: ``networks``,
``ms_per_network`` (the driver), ``ip_batch_ms_per_network`` (the reference), their ratio,
``noop_resync_s`` and ``noop_writes`` (must be 0), and ``teardown_s``. Targets: within
1.5x of ``ip -batch``; a no-change resync under 1 s with no write. Removes both namespaces
at the end and waits until the kernel has really removed their devices (``teardown_s``), so
that a next run is not measured against that work.

Run: ``make bench-netagent`` or ``.venv/bin/python bench/netagent.py`` (as root).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make the apps importable

from bench.common import log  # noqa: E402
from network.drivers.base import HostNetworks, Network, overlay_mtu  # noqa: E402
from network.drivers.linux import LinuxNetworkDriver  # noqa: E402

NETWORKS = 1000
FIRST_VNI = 10_000
LOCAL, REMOTE = "10.98.0.1", "10.98.0.2"
TEARDOWN_S = 300


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


def make_host(name: str, watch: str, sentinel: str) -> None:
    """Namespace ``name`` with underlay ``ul0``, whose veth peer ``sentinel`` lives in
    namespace ``watch``: it vanishes once the kernel has torn ``name`` down."""
    sh("ip", "netns", "add", name)
    sh("ip", "-n", name, "link", "add", "ul0", "type", "veth", "peer", "name", sentinel,
       "netns", watch)  # fmt: skip
    sh("ip", "-n", name, "addr", "add", f"{LOCAL}/24", "dev", "ul0")
    sh("ip", "-n", name, "link", "set", "ul0", "up")
    sh("ip", "-n", watch, "link", "set", sentinel, "up")


def tear_down(names: tuple[str, ...], watch: str) -> float:
    """Delete namespaces ``names`` and wait until the kernel has removed their devices (it
    does so in the background, holding the RTNL lock every device write needs: a next run
    started meanwhile would be measured against it). Returns the seconds it took."""
    start = time.perf_counter()
    for name in names:
        sh("ip", "netns", "del", name)
    while time.perf_counter() - start < TEARDOWN_S:
        left = subprocess.run(
            ["ip", "-n", watch, "-o", "link", "show", "type", "veth"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        if not left:
            break
        time.sleep(0.2)
    else:
        log(f"the kernel still tears the namespaces down after {TEARDOWN_S} s")
    return time.perf_counter() - start


def desired() -> HostNetworks:
    return HostNetworks(
        networks=tuple(
            Network(vni=vni, mtu=overlay_mtu(1500), local_vtep=LOCAL, remote_vteps=(REMOTE,))
            for vni in range(FIRST_VNI, FIRST_VNI + NETWORKS)
        ),
        underlay_device="ul0",
    )


def ip_batch(name: str, folder: Path) -> float:
    links, fdb = folder / "links.batch", folder / "fdb.batch"
    lines, entries = [], []
    for vni in range(FIRST_VNI, FIRST_VNI + NETWORKS):
        lines += [
            f"link add br-{vni} mtu 1450 type bridge",
            f"link add vx-{vni} mtu 1450 type vxlan id {vni} local {LOCAL} dstport 4789 "
            "nolearning dev ul0",
            f"link set br-{vni} up",
            f"link set vx-{vni} master br-{vni} up",
        ]
        entries.append(f"fdb append 00:00:00:00:00:00 dev vx-{vni} dst {REMOTE}")
    links.write_text("\n".join(lines) + "\n")
    fdb.write_text("\n".join(entries) + "\n")
    start = time.perf_counter()
    sh("ip", "-n", name, "-batch", str(links))
    sh("bridge", "-n", name, "-batch", str(fdb))
    return time.perf_counter() - start


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("bench/netagent.py needs root (network namespaces)")
    tag = uuid.uuid4().hex[:6]
    kumo_ns, ref_ns, watch = f"kb{tag}-kumo", f"kb{tag}-ipbatch", f"kb{tag}-watch"
    try:
        sh("ip", "netns", "add", watch)
        make_host(kumo_ns, watch, "s-kumo")
        make_host(ref_ns, watch, "s-ipbatch")
        state = desired()
        driver = LinuxNetworkDriver(kumo_ns)
        log(f"converging {NETWORKS} networks with the driver")
        start = time.perf_counter()
        first = driver.resync(state)
        kumo_s = time.perf_counter() - start
        start = time.perf_counter()
        noop = driver.resync(state)
        noop_s = time.perf_counter() - start
        driver.close()
        log(f"the same work with ip -batch and bridge -batch ({first.writes} driver writes)")
        with tempfile.TemporaryDirectory() as folder:
            reference_s = ip_batch(ref_ns, Path(folder))
        log("removing both namespaces")
        teardown_s = tear_down((kumo_ns, ref_ns), watch)
        result = {
            "networks": NETWORKS,
            "ms_per_network": round(kumo_s * 1000 / NETWORKS, 3),
            "ip_batch_ms_per_network": round(reference_s * 1000 / NETWORKS, 3),
            "vs_ip_batch": round(kumo_s / reference_s, 2),
            "writes": first.writes,
            "noop_resync_s": round(noop_s, 3),
            "noop_writes": noop.writes,
            "teardown_s": round(teardown_s, 2),
        }
        print(json.dumps(result), flush=True)
    finally:
        for name in (kumo_ns, ref_ns, watch):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


if __name__ == "__main__":
    main()
