"""Tenant networking through the real topology: the API (gunicorn), the controller, beat and
two host agents on libvirt's test driver, each converging its own network namespace of a
simulated fabric (``network.simfabric``) over a real broker. Needs root; skipped with the
reason otherwise. The fabric's namespaces go at the end, whatever happens."""

import signal
import subprocess
import uuid

import httpx
import pytest

from compute.choices import HostState
from compute.management.commands.simfleet import write_and_register
from compute.models import Host
from network import simfabric
from network.drivers.base import HostNetworks, bridge_name, port_name, vxlan_name
from network.drivers.linux import LinuxNetworkDriver
from network.models import HostNetwork
from tenants import services as tenants
from tests.e2e.processes import free_port, start_topology, wait_for
from tests.factories import UserFactory, make_image, make_project, make_template, token_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not simfabric.available(), reason="needs root and iproute2 (namespaces)"),
]

HOSTS = ["gpu-01", "gpu-02"]


def links(namespace: str) -> str:
    return subprocess.run(
        ["ip", "-n", namespace, "-o", "link"], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def fabric():
    prefix = f"ke{uuid.uuid4().hex[:5]}"
    sims = simfabric.ensure(HOSTS, gateway="none", prefix=prefix)
    yield {h.name: h for h in sims}
    for host in sims:  # take what the agents built away, router namespaces included
        driver = LinuxNetworkDriver(host.netns)
        try:
            driver.resync(HostNetworks())
        finally:
            driver.close()
    simfabric.remove(HOSTS, prefix=prefix)


@pytest.fixture
def cloud(fabric, fleet, tmp_path):
    fleet.env["KUMO_NETWORK_REPORT_INTERVAL_S"] = "2"
    fleet.env["KUMO_NETWORK_SYNC_S"] = "2"
    uris = write_and_register(tmp_path / "fleet", HOSTS)
    port = free_port()
    start_topology(
        fleet,
        bind=f"127.0.0.1:{port}",
        hosts=HOSTS,
        uris=uris,
        agent_args={name: sim.agent_args() for name, sim in fabric.items()},
    )
    owner = UserFactory()
    project = make_project(owner=owner)
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)

    def ready():
        up = Host.objects.filter(name__in=HOSTS, state=HostState.UP).count() == len(HOSTS)
        agents = HostNetwork.objects.filter(
            host__name__in=HOSTS, vtep_address__isnull=False
        ).count()
        return up and agents == len(HOSTS)

    wait_for(ready, timeout=90, what="both agents up with their network side", fleet=fleet)
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        timeout=20,
        headers={"Authorization": f"Bearer {token_for(owner)}"},
    )
    return fleet, api, f"/api/v1/projects/{project.slug}", uris


def test_vms_on_two_hosts_get_their_overlay_and_a_restarted_agent_rebuilds_it(cloud, fabric):
    fleet, api, base, uris = cloud
    net = api.post(f"{base}/networks/", json={"name": "lab", "cidr": "10.30.0.0/24"}).json()
    template, image = make_template(gpus=8).name, make_image().pk  # one whole node each
    for name in ("left", "right"):
        r = api.post(
            f"{base}/vms/",
            json={"name": name, "template": template, "image": image, "nics": [{"network": "lab"}]},
        )
        assert r.status_code == 202, r.text

    def ports_active():
        ports = api.get(f"{base}/ports/").json()["results"]
        return len(ports) == 2 and all(p["status"] == "active" for p in ports) and ports

    ports = wait_for(ports_active, timeout=90, what="both ports active", fleet=fleet)
    assert {p["host"] for p in ports} == set(HOSTS)
    vni = net["vni"]
    for port in ports:
        here = links(fabric[port["host"]].netns)
        assert port_name(port["id"].replace("-", "")) in here
        assert bridge_name(vni) in here and vxlan_name(vni) in here
    left = next(p for p in ports if p["host"] == "gpu-01")
    right = next(p for p in ports if p["host"] == "gpu-02")

    # A port turns active once its own host converged it; the other host learns its entry
    # with its own next sync.
    def fdb() -> str:
        return subprocess.run(
            ["bridge", "-n", fabric["gpu-01"].netns, "fdb", "show", "dev", vxlan_name(vni)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    entry = f"{right['mac']} dst {fabric['gpu-02'].vtep}"
    wait_for(lambda: entry in fdb(), timeout=30, what="gpu-02's port in gpu-01's FDB", fleet=fleet)
    assert entry in fdb()

    # The agent dies, and its host loses the network behind its back; the agent that
    # comes back reports generation 0 and is sent everything again.
    fleet.kill("agent-gpu-01", signal.SIGKILL)
    subprocess.run(
        ["ip", "-n", fabric["gpu-01"].netns, "link", "del", bridge_name(vni)], check=True
    )
    assert bridge_name(vni) not in links(fabric["gpu-01"].netns)
    start_topology(
        fleet,
        bind="127.0.0.1:1",
        hosts=HOSTS,
        only={"agent-gpu-01"},
        uris=uris,
        agent_args={"gpu-01": fabric["gpu-01"].agent_args()},
    )
    wait_for(
        lambda: bridge_name(vni) in links(fabric["gpu-01"].netns),
        timeout=60,
        what="the restarted agent rebuilding the bridge",
        fleet=fleet,
    )
    here = links(fabric["gpu-01"].netns)
    assert f"master {bridge_name(vni)}" in here and port_name(left["id"].replace("-", "")) in here
