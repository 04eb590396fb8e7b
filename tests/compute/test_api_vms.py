"""The compute API: VMs through HTTP, errors that name the field, 409s that name the state,
the operators' fleet view."""

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from compute.models import VirtualMachine
from tenants import services as tenants
from tests.factories import make_host, make_image, make_network, make_template
from tests.tenants.test_sshkeys import _openssh_public

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client_for, project):
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    return client_for(project.owner)


def url(project, suffix=""):
    return f"/api/v1/projects/{project.slug}/vms/{suffix}"


def test_create_answers_202_with_the_vm_and_its_operation(api, project):
    make_host("gpu-01")
    key = _openssh_public(ed25519.Ed25519PrivateKey.generate())
    tenants.sshkey_add(user=project.owner, public_key=key, name="laptop")
    template, image = make_template(gpus=4), make_image()
    response = api.post(
        url(project),
        {
            "name": "train-1",
            "template": template.name,
            "image": image.pk,
            "ssh_keys": ["laptop"],
            "user_data": "#cloud-config\n",
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "provisioning" and body["host"] == "gpu-01"
    assert len(body["gpu_addresses"]) == 4 and body["numa_cell"] in (0, 1)
    assert response["Location"].endswith(f"/vms/{body['id']}/")
    assert "/operations/" in body["operation"]
    assert VirtualMachine.objects.get(pk=body["id"]).ssh_keys == [key]
    listed = api.get(url(project), {"state": "provisioning"}).json()
    assert [vm["id"] for vm in listed["results"]] == [body["id"]]


@pytest.mark.parametrize("placed", [True, False], ids=["placed", "pending"])
def test_the_create_answer_is_the_vm_as_a_read_of_it_gives_it(api, project, placed):
    """The create answers from the VM as it left it, not read again: the same body as a
    GET of the VM right after (its claim's changes, GPUs, ports and addresses included)."""
    if placed:
        make_host("gpu-01")
    make_network(project, "lab")
    template, image = make_template(gpus=2), make_image()
    response = api.post(
        url(project),
        {"name": "same", "template": template.name, "image": image.pk,
         "nics": [{"network": "lab"}]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 202, response.content
    created = response.json()
    assert "/operations/" in created.pop("operation")
    assert created == api.get(url(project, f"{created['id']}/")).json()
    assert created["state"] == ("provisioning" if placed else "pending")
    assert len(created["gpu_addresses"]) == (2 if placed else 0)
    assert created["nics"][0]["network"] == "lab" and created["nics"][0]["fixed_ips"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Not_A_Hostname"}, "name"),
        ({"template": "no-such-size"}, "template"),
        ({"image": 999999}, "image"),
        ({"ssh_keys": ["nobody"]}, "ssh_keys"),
        ({"user_data": "x" * (64 * 1024 + 1)}, "user_data"),
        ({"priority": "cheap"}, "priority"),
        ({"placement_group": "none-here"}, "placement_group"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, project, change, field):
    payload = {"name": "ok", "template": make_template().name, "image": make_image().pk}
    response = api.post(url(project), {**payload, **change}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["details"], response.json()


def test_no_capacity_without_waiting_is_a_409(api, project):
    payload = {
        "name": "big",
        "template": make_template(gpus=8).name,
        "image": make_image().pk,
        "wait_for_capacity": False,
    }
    response = api.post(url(project), payload, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "no_capacity"
    assert "no host has" in response.json()["message"]


def test_an_illegal_action_is_a_409_naming_the_state(api, project):
    payload = {"name": "waits", "template": make_template(gpus=2).name, "image": make_image().pk}
    vm = api.post(url(project), payload, format="json").json()
    assert vm["state"] == "pending"
    response = api.post(url(project, f"{vm['id']}/stop/"))
    assert response.status_code == 409
    assert response.json()["details"]["state"] == ["pending"]
    deleted = api.delete(url(project, f"{vm['id']}/"))
    assert deleted.status_code == 202 and deleted.json()["state"] == "succeeded"
    assert api.get(url(project, f"{vm['id']}/")).json()["state"] == "deleted"


def test_templates_are_listed_for_everyone(api):
    make_template(gpus=8, name="gpu-full")
    names = [t["name"] for t in api.get("/api/v1/templates/").json()["results"]]
    assert "gpu-full" in names


def test_operators_see_capacity_and_label_hosts(client_for, staff):
    make_host("gpu-07")
    api = client_for(staff)
    host = api.get("/api/v1/admin/hosts/gpu-07/").json()
    assert (host["vcpus"], host["gpus"], host["gpus_free"]) == (128, 8, 8)
    assert [c["id"] for c in host["numa_cells"]] == [0, 1]
    changed = api.patch(
        "/api/v1/admin/hosts/gpu-07/", {"rack": "r12", "cpu_allocation_ratio": 2}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["rack"] == "r12"
    devices = api.get("/api/v1/admin/devices/", {"host": "gpu-07", "kind": "gpu"}).json()
    assert devices["count"] == 8
    assert (
        api.patch(
            "/api/v1/admin/hosts/gpu-07/", {"cpu_allocation_ratio": 99}, format="json"
        ).status_code
        == 400
    )


def test_members_cannot_reach_operator_endpoints(client_for, project):
    assert client_for(project.owner).get("/api/v1/admin/vms/").status_code == 403
