"""The network driver contract (``network.drivers.base.NetworkDriver``), run against every
driver: the Linux one on a real kernel, in a network namespace of its own (root only), and
the in-memory fake that tests of the agent's surroundings use. What one does, the other
does: the same names created and removed, no write when converged, changes in place, and
refusals before any write."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import replace

import pytest

from network.drivers.base import (
    HostNetworks,
    Network,
    NetworkDriver,
    NetworkDriverError,
    Port,
    bridge_name,
    port_name,
    vxlan_name,
)
from network.drivers.fake import FakeNetworkDriver
from network.drivers.linux import LinuxNetworkDriver

VTEP = "10.98.0.1"
VNI = 3001
NET = Network(vni=VNI, mtu=1450, local_vtep=VTEP, remote_vteps=("10.98.0.2",))
TAP = Port(port_id="c0ffee000001", vni=VNI, mac="02:00:00:00:30:01", kind="tap")
STATE = HostNetworks(networks=(NET,), ports=(TAP,))
KUMOS = {vxlan_name(VNI), bridge_name(VNI), port_name(TAP.port_id)}
ROOT = os.geteuid() == 0 and shutil.which("ip") is not None


def _sh(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30)


@pytest.fixture(params=["fake", "linux"])
def driver(request, tmp_path):
    if request.param == "fake":
        fake = FakeNetworkDriver()
        yield fake
        fake.close()
        return
    if not ROOT:
        pytest.skip("the Linux driver needs root and iproute2 (a network namespace)")
    netns = f"kc{uuid.uuid4().hex[:8]}"
    _sh("ip", "netns", "add", netns)
    try:
        # The underlay address the VXLAN device sends from.
        _sh("ip", "-n", netns, "link", "add", "ul0", "type", "veth", "peer", "name", "ul1")
        _sh("ip", "-n", netns, "addr", "add", f"{VTEP}/24", "dev", "ul0")
        _sh("ip", "-n", netns, "link", "set", "ul0", "up")
        linux = LinuxNetworkDriver(netns, dns_dir=tmp_path / "dns")
        yield linux
        linux.close()
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False, timeout=30)


def test_every_driver_is_a_network_driver(driver):
    assert isinstance(driver, NetworkDriver)


def test_the_first_resync_makes_kumos_devices_and_a_second_writes_nothing(driver):
    first = driver.resync(STATE)
    assert first.writes > 0 and set(first.created) >= KUMOS and first.removed == []
    again = driver.resync(STATE)
    assert (again.writes, again.created, again.removed) == (0, [], [])


def test_a_changed_setting_is_changed_in_place(driver):
    driver.resync(STATE)
    changed = replace(NET, mtu=1400, remote_vteps=("10.98.0.2", "10.98.0.3"))
    result = driver.resync(replace(STATE, networks=(changed,)))
    assert result.writes > 0 and result.created == [] and result.removed == []
    assert driver.resync(replace(STATE, networks=(changed,))).writes == 0


def test_a_port_that_goes_takes_its_device_and_the_network_stays(driver):
    driver.resync(STATE)
    result = driver.resync(replace(STATE, ports=()))
    assert result.removed == [port_name(TAP.port_id)] and result.created == []


def test_an_empty_state_removes_everything_kumo_made(driver):
    driver.resync(STATE)
    result = driver.resync(HostNetworks())
    assert set(result.removed) >= KUMOS and result.created == []
    again = driver.resync(HostNetworks())
    assert (again.writes, again.removed) == (0, [])


def test_a_missing_underlay_or_trunk_is_refused_before_any_write(driver):
    for missing in (
        replace(STATE, underlay_device="nosuch0"),
        replace(STATE, networks=(replace(NET, l2vpn_vlan=7),), trunk_device="nosuch1"),
    ):
        with pytest.raises(NetworkDriverError, match="is missing"):
            driver.resync(missing)
    # Nothing was made: the first real resync makes everything.
    assert set(driver.resync(STATE).created) >= KUMOS


def test_capabilities_name_the_hosts_sr_iov_functions(driver):
    assert driver.capabilities() == {"sriov_pfs": {}}
