"""A broker restart loses no accepted request and stops no process (issue 13, fault 1).

The real topology (gunicorn, the controller, beat, two host agents on libvirt's test driver)
runs on PostgreSQL and a private Redis this test starts on its own port. With VM creates and
deletes in flight through the API, Redis is killed and restarted empty, once briefly and once
for longer than the hosts' heartbeat timeout; every accepted request must complete (the
database is desired state, the reconcile re-issues what the broker lost) and every process
must still be the one that was started (none exited, none needed a restart). The deletes also
race the controller's provisioning → running updates: none may answer 409 (fault 3)."""

import os
import shutil
import subprocess
import time

import httpx
import pytest
from celery import Celery

from compute.choices import HostState
from compute.management.commands.simfleet import write_and_register
from compute.models import Host, OrphanGuest, VirtualMachine
from compute.protocol import VM_APPLY_TASK, VmApply
from tenants import services as tenants
from tests.e2e.processes import Fleet, database_url, free_port, start_topology, wait_for
from tests.factories import UserFactory, make_image, make_project, make_template, token_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server not installed"),
]

HOSTS = ["cpu-01", "cpu-02"]
HEARTBEAT_TIMEOUT_S = 4


class PrivateRedis:
    """A Redis of the test's own, on a free port, with no persistence: a restart is empty."""

    def __init__(self, directory):
        self.port = free_port()
        self.directory = directory
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        import redis

        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), timeout=10, what="private redis up")

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def _pings(client) -> bool:
    try:
        return client.ping()
    except Exception:
        return False


@pytest.fixture
def redis_server(tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def cloud(redis_server, tmp_path):
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=redis_server.url,
        KUMO_VAR_DIR=str(tmp_path),
        KUMO_HEARTBEAT_INTERVAL_S="1",
        KUMO_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S),
        KUMO_GUESTS_REPORT_INTERVAL_S="2",
        KUMO_RECONCILE_GRACE_S="1",
        DATABASE_TEST_NAME="",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    fleet = Fleet(env, tmp_path)
    uris = write_and_register(tmp_path / "fleet", HOSTS)
    port = free_port()
    start_topology(fleet, bind=f"127.0.0.1:{port}", hosts=HOSTS, uris=uris)
    owner = UserFactory()
    project = make_project(owner=owner)
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=0, vms=256)

    def hosts_ready():
        return Host.objects.filter(
            name__in=HOSTS, state=HostState.UP, guests_reported_at__isnull=False
        ).count() == len(HOSTS)

    wait_for(hosts_ready, timeout=90, what="both agents up and reporting", fleet=fleet)
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        timeout=30,
        headers={"Authorization": f"Bearer {token_for(owner)}"},
    )
    yield {
        "fleet": fleet,
        "api": api,
        "vms": f"/api/v1/projects/{project.slug}/vms/",
        "template": make_template(gpus=0, vcpus=1, memory_gib=1).name,
        "image": make_image().pk,
    }
    api.close()
    fleet.stop()


def _restart_broker(redis_server, outage_s: float):
    redis_server.kill()
    time.sleep(outage_s)
    redis_server.start()


@pytest.mark.parametrize("outage_s", [1.0, HEARTBEAT_TIMEOUT_S + 3.0], ids=["short", "long"])
def test_broker_restart_with_work_in_flight_loses_nothing(cloud, redis_server, outage_s):
    api, fleet = cloud["api"], cloud["fleet"]
    started = {name: proc.pid for name, proc in fleet.procs.items()}
    count = 16

    def create(i):
        r = api.post(
            cloud["vms"],
            json={"name": f"b-{i}", "template": cloud["template"], "image": cloud["image"]},
        )
        assert r.status_code == 202, r.text
        return r.json()["id"]

    # Creates in flight when the broker dies, and more accepted while it is away.
    ids = [create(i) for i in range(count // 2)]
    _restart_broker(redis_server, outage_s)
    ids += [create(i) for i in range(count // 2, count)]

    def all_in(states):
        return (
            VirtualMachine.objects.filter(pk__in=ids, state__in=states).count() == len(ids) and ids
        )

    # Delete half as soon as they are accepted (racing provisioning → running), the rest
    # once running; the broker dies again with the deletes in flight.
    conflicts = []
    for vm_id in ids[: count // 2]:
        r = api.delete(f"{cloud['vms']}{vm_id}/")
        if r.status_code == 409:
            conflicts.append(r.text)
        assert r.status_code in (202, 409), r.text
    wait_for(
        lambda: (
            VirtualMachine.objects.filter(pk__in=ids[count // 2 :], state="running").count()
            == count // 2
        ),
        timeout=120,
        what="the creates running after the broker restart",
        fleet=fleet,
    )
    for vm_id in ids[count // 2 :]:
        r = api.delete(f"{cloud['vms']}{vm_id}/")
        assert r.status_code == 202, r.text
    _restart_broker(redis_server, outage_s)
    wait_for(
        lambda: all_in(["deleted"]),
        timeout=120,
        what="every accepted delete done after the broker restart",
        fleet=fleet,
    )
    assert conflicts == []
    # Every process is the one started: none exited, none was restarted.
    for name, proc in fleet.procs.items():
        assert proc.poll() is None, f"{name} exited\n{fleet.logs()}"
        assert proc.pid == started[name]
    for log in fleet.log_dir.glob("*.log"):
        text = log.read_text(errors="replace")
        assert "Unrecoverable error" not in text, f"{log.name}:\n{text[-5000:]}"
    # A create the broker delivers again after the VM's deletion (fault 2) changes nothing:
    # replayed to the deleted VM's host, it is refused by the agent's record of the removal.
    victim = VirtualMachine.objects.select_related("host").get(pk=ids[-1])
    replay = VmApply(
        vm_id=str(victim.pk),
        generation=2,
        desired="running",
        name="replayed",
        hostname="replayed",
        vcpus=1,
        memory_mib=1024,
        image_location="/var/lib/kumo/images/x.qcow2",
        disk_gib=1,
    )
    sender = Celery("replay", broker=redis_server.url)
    sender.send_task(VM_APPLY_TASK, kwargs=replay.to_wire(), queue=f"host.{victim.host.name}")
    agent_log = fleet.log_dir / f"agent-{victim.host.name}.log"
    wait_for(
        lambda: f"vm {victim.pk}: generation 2 running ignored" in agent_log.read_text(),
        timeout=30,
        what="the replayed create refused",
        fleet=fleet,
    )
    assert not OrphanGuest.objects.filter(vm_id=str(victim.pk)).exists()
    assert VirtualMachine.objects.get(pk=victim.pk).state == "deleted"
    # And the fleet still works: a new VM runs.
    new = create(count)
    wait_for(
        lambda: VirtualMachine.objects.filter(pk=new, state="running").exists(),
        timeout=60,
        what="a VM created after the restarts running",
        fleet=fleet,
    )
