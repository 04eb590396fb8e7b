"""Spot eviction through the real topology: gunicorn, the controller, beat and two host
agents on libvirt's test driver (8x A100 each), over a real broker. The fleet is filled with
spot GPU VMs; an on-demand 8-GPU VM is requested; the victims get a short notice (visible
in the API, as events and to the guest through its metadata token, which one guest uses
to cut its notice short), are evicted, and the on-demand VM runs on the freed host."""

import httpx
import pytest

from compute.choices import DeviceKind, HostState
from compute.drivers import cloudinit
from compute.management.commands.simfleet import write_and_register
from compute.models import Device, Host, VirtualMachine
from tenants import services as tenants
from tenants.models import UsageRecord
from tests.e2e.processes import free_port, start_topology, wait_for
from tests.factories import UserFactory, make_image, make_project, make_template, token_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

HOSTS = ["gpu-01", "gpu-02"]
NOTICE_S = 4


def test_an_on_demand_8_gpu_vm_evicts_spot_vms_after_their_notice(fleet, tmp_path):
    fleet.env.update(KUMO_SPOT_REAP_S="1", KUMO_SPOT_STOP_GRACE_S="2")
    uris = write_and_register(tmp_path / "fleet", HOSTS)
    port = free_port()
    fleet.env["KUMO_METADATA_URL"] = f"http://127.0.0.1:{port}/api/v1/metadata"
    start_topology(fleet, bind=f"127.0.0.1:{port}", hosts=HOSTS, uris=uris)
    owner = UserFactory()
    project = make_project(owner=owner)
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    base = f"http://127.0.0.1:{port}"
    api = httpx.Client(
        base_url=base, timeout=20, headers={"Authorization": f"Bearer {token_for(owner)}"}
    )
    vms = f"/api/v1/projects/{project.slug}/vms/"
    spot4 = make_template(gpus=4, eviction_notice_s=NOTICE_S).name
    od8 = make_template(gpus=8).name
    image = make_image().pk
    wait_for(
        lambda: (
            Host.objects.filter(
                name__in=HOSTS, state=HostState.UP, guests_reported_at__isnull=False
            ).count()
            == 2
        ),
        timeout=90,
        what="both agents up and reporting",
        fleet=fleet,
    )

    # Fill the fleet: four 4-GPU spot VMs, all running.
    urls = []
    for n in range(4):
        r = api.post(
            vms, json={"name": f"spot-{n}", "template": spot4, "image": image, "priority": "spot"}
        )
        assert r.status_code == 202, r.text
        urls.append(r.headers["Location"])
    for url in urls:
        wait_for(
            lambda url=url: api.get(url).json()["state"] == "running",
            timeout=90,
            what=f"{url} running",
            fleet=fleet,
        )

    # The on-demand request: pending, two victims on one host under notice.
    r = api.post(vms, json={"name": "train", "template": od8, "image": image})
    assert r.status_code == 202, r.text
    train = r.json()
    assert train["state"] == "pending"
    spots = [api.get(url).json() for url in urls]
    victims = [v for v in spots if v["state"] == "evicting"]
    assert len(victims) == 2 and len({v["host"] for v in victims}) == 1
    host = victims[0]["host"]
    assert all(v["eviction_deadline"] for v in victims)
    kinds = [
        e["kind"] for e in api.get(f"/api/v1/projects/{project.slug}/events/").json()["results"]
    ]
    assert kinds.count("vm.eviction_notice") == 2 and "vm.preempting" in kinds

    # The guest's view: its token is in its seed; the notice is there; one acknowledges.
    seed = tmp_path / "instances" / host / victims[0]["id"] / "seed.iso"
    vendor = cloudinit.read_seed(seed)["vendor-data"]
    token = vendor.split("KUMO_METADATA_TOKEN=")[1].split()[0].strip("'\"")
    meta = httpx.Client(base_url=base, timeout=20, headers={"X-Kumo-Metadata-Token": token})
    action = meta.get("/api/v1/metadata/spot/instance-action")
    assert action.status_code == 200 and action.json()["action"] == "stop"
    assert meta.post("/api/v1/metadata/spot/acknowledge").status_code == 200

    # Evicted after the host stopped them; the on-demand VM runs with all 8 GPUs there.
    train = wait_for(
        lambda: (t := api.get(f"{vms}{train['id']}/").json())["state"] == "running" and t,
        timeout=120,
        what="the on-demand VM running",
        fleet=fleet,
    )
    assert train["host"] == host and len(train["gpu_addresses"]) == 8
    for victim in victims:
        body = api.get(f"{vms}{victim['id']}/").json()
        assert body["state"] == "evicted" and body["evicted_at"] and body["host"] is None
        assert not Device.objects.filter(vm_id=victim["id"]).exists()
    first = VirtualMachine.objects.get(pk=victims[0]["id"])
    assert first.eviction_acknowledged_at is not None
    gpus = Device.objects.filter(host__name=host, kind=DeviceKind.GPU)  # not its NICs
    assert set(gpus.values_list("vm_id", flat=True)) == {
        VirtualMachine.objects.get(pk=train["id"]).pk
    }

    # Each victim's bill stops at its eviction: every interval is closed at evicted_at.
    for victim in victims:
        vm = VirtualMachine.objects.get(pk=victim["id"])
        records = UsageRecord.objects.filter(subject_id=str(vm.pk))
        assert records.exists() and not records.filter(ended_at__isnull=True).exists()
        assert {r.ended_at for r in records.filter(ended_at__gte=vm.evicted_at)} == {vm.evicted_at}
