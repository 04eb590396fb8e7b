"""The agent's half of live volumes: a new generation of a running guest's ``VmApply``
attaches, grows and detaches its volumes at once (``host_tasks.converge_volumes``), on the
fake hypervisor, which keeps a running guest's disks apart from its definition as a real
one does. The real hypervisor's half: ``test_live_volumes.py``."""

import pytest

from compute import host_tasks
from compute.drivers import simnode
from compute.drivers.fake import FakeDriver
from compute.protocol import VmApply, VolumeWire
from controlplane.agent import runtime
from controlplane.agent.config import AgentConfig

VM = "0b4e2c1a-5d6f-4e3b-9a8c-7d6e5f4a3b2c"
GIB = 1 << 30


@pytest.fixture(autouse=True)
def agent(tmp_path):
    runtime.configure(
        AgentConfig.from_env(host="cpu-01", var_dir=tmp_path, instances_dir=tmp_path / "i")
    )
    yield
    runtime.configure(None)


def _message(generation, volumes=()):
    return VmApply(
        vm_id=VM,
        generation=generation,
        desired="running",
        name="lab/cpu-1",
        hostname="cpu-1",
        vcpus=1,
        memory_mib=256,
        volumes=volumes,
    )


def _volume(size_gib=10, device="vdb", name="vol-aa"):
    return VolumeWire(
        volume_id="aa", pool="kumo-local", name=name, size_gib=size_gib, device=device,
        serial="0a1b2c3d4e5f6a7b8c9d",
    )  # fmt: skip


def test_a_running_guest_gets_grows_and_loses_a_volume_at_once():
    fake = FakeDriver(inventory=simnode.host_inventory("cpu"))
    assert host_tasks.apply(_message(1), fake) == (1, "running")
    guest = fake._guests[VM]
    assert guest.live_disks == {}

    host_tasks.apply(_message(2, (_volume(),)), fake)
    assert guest.power.value == "running"
    assert guest.live_disks["vdb"].serial == "0a1b2c3d4e5f6a7b8c9d"
    assert guest.live_sizes["vdb"] == 10 * GIB
    calls = len(fake.calls)
    host_tasks.apply(_message(2, (_volume(),)), fake)  # a repeated message
    assert guest.live_sizes["vdb"] == 10 * GIB
    assert ("ensure_stopped", VM) not in fake.calls[calls:]  # no reboot, ever

    host_tasks.apply(_message(3, (_volume(size_gib=20),)), fake)
    assert guest.live_sizes["vdb"] == 20 * GIB

    # Another volume takes vdb: the old one leaves, the new one arrives.
    host_tasks.apply(_message(4, (_volume(name="vol-bb"),)), fake)
    assert guest.live_disks["vdb"].source == "vol-bb"

    host_tasks.apply(_message(5), fake)
    assert guest.live_disks == {}
    assert fake.volume_disks(VM) == {}
    assert ("ensure_stopped", VM) not in fake.calls
