"""GPU VMs through the real topology: the API (gunicorn), the controller, beat and two host
agents on libvirt's test driver, each with a simulated 8x A100 node, over a real broker."""

import os
import signal

import httpx
import pytest

from compute.choices import HostState
from compute.drivers.domain_xml import parse_hostdev_addresses
from compute.management.commands.simfleet import write_and_register
from compute.models import Device, Host, VirtualMachine
from tenants import services as tenants
from tests.e2e.processes import free_port, start_topology, wait_for
from tests.factories import UserFactory, make_image, make_project, make_template, token_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

HOSTS = ["gpu-01", "gpu-02"]


@pytest.fixture
def cloud(fleet, tmp_path):
    """The running topology, a project with room, a 4-GPU template and an image."""
    uris = write_and_register(tmp_path / "fleet", HOSTS)
    port = free_port()
    start_topology(fleet, bind=f"127.0.0.1:{port}", hosts=HOSTS, uris=uris)
    owner = UserFactory()
    project = make_project(owner=owner)
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    staff = UserFactory(is_staff=True)

    def client(user):
        return httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=20,
            headers={"Authorization": f"Bearer {token_for(user)}"},
        )

    def hosts_ready():
        return Host.objects.filter(
            name__in=HOSTS, state=HostState.UP, guests_reported_at__isnull=False
        ).count() == len(HOSTS)

    wait_for(hosts_ready, timeout=90, what="both agents up and reporting", fleet=fleet)
    return {
        "fleet": fleet,
        "port": port,
        "uris": uris,
        "api": client(owner),
        "admin": client(staff),
        "vms": f"/api/v1/projects/{project.slug}/vms/",
        "template": make_template(gpus=4).name,
        "image": make_image().pk,
    }


def _operation_result(api, response, fleet):
    assert response.status_code == 202, response.text
    location = response.headers["Location"]
    done = wait_for(
        lambda: (r := api.get(location).json())["state"] in ("succeeded", "failed") and r,
        timeout=60,
        what=f"operation {location}",
        fleet=fleet,
    )
    assert done["state"] == "succeeded", done
    return done["result"]


def _running(api, url, fleet):
    return wait_for(
        lambda: (r := api.get(url).json())["state"] == "running" and r,
        timeout=90,
        what=f"{url} running",
        fleet=fleet,
    )


def test_gpu_vm_runs_in_libvirt_with_its_gpus_passed_through(cloud):
    api, admin, fleet = cloud["api"], cloud["admin"], cloud["fleet"]
    created = api.post(
        cloud["vms"],
        json={"name": "train-1", "template": cloud["template"], "image": cloud["image"]},
    )
    assert created.status_code == 202, created.text
    vm = _running(api, created.headers["Location"], fleet)
    assert vm["power_state"] == "running" and len(vm["gpu_addresses"]) == 4

    # Read back through libvirt itself: the agent answers with the domain's XMLDesc.
    described = admin.post(f"/api/v1/admin/vms/{vm['id']}/describe/")
    result = _operation_result(admin, described, fleet)
    assert result["power"] == "running"
    assert sorted(parse_hostdev_addresses(result["domain_xml"])) == sorted(vm["gpu_addresses"])
    cells = set(Device.objects.filter(vm_id=vm["id"]).values_list("numa_node", flat=True))
    assert cells == {vm["numa_cell"]}
    assert '<hostdev mode="subsystem" type="pci" managed="yes">' in result["domain_xml"].replace(
        "'", '"'
    )

    # Stop, then delete: the GPUs come back once the host has removed the guest.
    stop = api.post(f"{created.headers['Location']}stop/")
    _operation_result(api, stop, fleet)
    assert api.get(created.headers["Location"]).json()["state"] == "stopped"
    _operation_result(api, api.delete(created.headers["Location"]), fleet)
    assert VirtualMachine.objects.get(pk=vm["id"]).state == "deleted"
    assert not Device.objects.filter(vm_id=vm["id"]).exists()


def test_an_agent_killed_mid_create_converges_after_restart_with_one_guest(cloud):
    """The agent dies with the create in flight: frozen (SIGSTOP) before the request, so
    whatever it had fetched from the broker dies with it unapplied, then killed. The VM is
    placed and provisioning; once the agent is back, its first guests report shows the guest
    missing and the controller sends the work again."""
    api, admin, fleet = cloud["api"], cloud["admin"], cloud["fleet"]
    agents = {h: fleet.procs[f"agent-{h}"] for h in HOSTS}
    for proc in agents.values():
        os.killpg(proc.pid, signal.SIGSTOP)
    created = api.post(
        cloud["vms"],
        json={"name": "survivor", "template": cloud["template"], "image": cloud["image"]},
    )
    assert created.status_code == 202, created.text
    body = created.json()
    host = body["host"]
    fleet.kill(f"agent-{host}", signal.SIGKILL)
    for name, proc in agents.items():
        if name != host:
            os.killpg(proc.pid, signal.SIGCONT)
    assert VirtualMachine.objects.get(pk=body["id"]).state == "provisioning"
    start_topology(
        fleet,
        bind=f"127.0.0.1:{cloud['port']}",
        hosts=HOSTS,
        only={f"agent-{host}"},
        uris=cloud["uris"],
    )
    _running(api, created.headers["Location"], fleet)
    guests = _operation_result(admin, admin.post(f"/api/v1/admin/hosts/{host}/guests/"), fleet)
    assert [g["vm_id"] for g in guests["guests"]] == [body["id"]]
    assert guests["guests"][0]["power"] == "running"
