"""The real topology: web (gunicorn), controller and host agents as separate processes,
talking through a real broker (the embedded filesystem one, and Redis where it runs)."""

import httpx
import pytest

from compute.choices import HostState
from compute.models import Host
from controlplane.models import Operation
from tests.e2e.processes import free_port, start_topology, wait_for
from tests.factories import UserFactory, token_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_agents_report_and_answer_operations_and_queued_work_survives_an_agent_crash(fleet):
    port = free_port()
    start_topology(fleet, bind=f"127.0.0.1:{port}", hosts=["sim-01", "sim-02"])
    staff = UserFactory(is_staff=True)
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {token_for(staff)}"},
        timeout=10,
    )

    def hosts_up():
        return set(Host.objects.filter(state=HostState.UP).values_list("name", flat=True)) == {
            "sim-01",
            "sim-02",
        }

    # Each agent's first heartbeat enrolls its host; the operator sees both up.
    wait_for(hosts_up, timeout=60, what="both agents' heartbeats", fleet=fleet)
    wait_for(lambda: _get(api, "/readyz") == 200, timeout=30, what="web", fleet=fleet)
    listed = api.get("/api/v1/admin/hosts/").json()["results"]
    assert {h["name"]: h["state"] for h in listed} == {"sim-01": "up", "sim-02": "up"}

    # An asynchronous operation: 202, then the agent's answer reaches the operation.
    response = api.post("/api/v1/admin/hosts/sim-01/ping/")
    assert response.status_code == 202, response.text
    operation_url = response.headers["Location"]
    assert response.json()["state"] == "pending"
    done = wait_for(
        lambda: (r := api.get(operation_url).json())["state"] == "succeeded" and r,
        timeout=30,
        what="the ping's answer",
        fleet=fleet,
    )
    assert done["result"]["host"] == "sim-01"

    # The agent dies; work sent to it meanwhile waits in its queue, and is done once it is back.
    fleet.kill("agent-sim-02")
    response = api.post("/api/v1/admin/hosts/sim-02/ping/")
    assert response.status_code == 202
    operation_id = response.json()["id"]
    assert Operation.objects.get(pk=operation_id).state == "pending"
    start_topology(fleet, bind=f"127.0.0.1:{port}", hosts=["sim-02"], only={"agent-sim-02"})
    wait_for(
        lambda: Operation.objects.get(pk=operation_id).state == "succeeded",
        timeout=60,
        what="the queued ping after the agent restarted",
        fleet=fleet,
    )
    assert Operation.objects.filter(kind="host.ping", state="succeeded").count() == 2


def _get(api, path):
    try:
        return api.get(path).status_code
    except httpx.HTTPError:
        return None
