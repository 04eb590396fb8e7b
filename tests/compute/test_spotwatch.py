"""The watcher Kumo ships into guests (``compute.drivers.spotwatch``), run here as the guest
runs it, against a live Kumo: its ``checkpoint`` command records the job's checkpoint, and an
acknowledgement the endpoint did not take is sent again until it is."""

import importlib.util
import urllib.error

import pytest
from django.db import transaction
from django.utils import timezone

from compute import services
from compute.choices import VmState, VmTask
from compute.drivers import spotwatch
from compute.services import spot
from tests.compute.test_vms import fresh, report
from tests.factories import make_host, make_template, make_vm

pytestmark = pytest.mark.django_db(transaction=True)


def _watcher(tmp_path, url: str, token: str):
    script = tmp_path / "spot-watch.py"
    script.write_text(spotwatch.SCRIPT)
    spec = importlib.util.spec_from_file_location("spot_watch", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = tmp_path / "metadata.env"  # the guest's /etc/kumo/metadata.env
    env.write_text(f"KUMO_METADATA_URL={url}\nKUMO_METADATA_TOKEN={token}\n")
    module.METADATA_ENV = str(env)
    return module


def test_the_checkpoint_command_records_the_jobs_checkpoint(
    live_server, tmp_path, project, sent, capsys
):
    make_host()
    vm = make_vm(project, template=make_template(gpus=1), priority="spot")
    report(fresh(vm), "running")
    watcher = _watcher(tmp_path, f"{live_server.url}/api/v1/metadata", vm.metadata_token)
    assert watcher.checkpoint() == 0
    saved = fresh(vm).checkpointed_at
    assert saved is not None
    assert (
        f"checkpoint recorded at {saved.isoformat()}".replace("+00:00", "Z")
        in capsys.readouterr().out
    )

    services.vm_stop(vm=fresh(vm))
    report(fresh(vm), "shutoff")
    assert watcher.checkpoint() == 1  # a stopped VM's report does not count: 409
    assert "checkpoint not recorded: HTTP Error 409" in capsys.readouterr().out
    assert fresh(vm).checkpointed_at == saved

    watcher.METADATA_ENV = str(tmp_path / "absent.env")  # not root: no token to read
    assert watcher.checkpoint() == 1
    assert "no metadata URL or token" in capsys.readouterr().out


def test_an_acknowledgement_not_taken_is_sent_again_until_it_is(
    live_server, tmp_path, project, sent, capsys, monkeypatch
):
    make_host()
    vm = make_vm(project, template=make_template(gpus=1), priority="spot")
    report(fresh(vm), "running")
    with transaction.atomic():
        deadline = spot.notify(fresh(vm), None, timezone.now(), why="for the test")
    base = f"{live_server.url}/api/v1/metadata"
    watcher = _watcher(tmp_path, base, vm.metadata_token)
    watcher.SPOT_ENV = str(tmp_path / "spot.env")  # no hook
    watcher.DONE = str(tmp_path / "run" / "spot-acknowledged")
    asked, busy, real = [], [True], watcher.request

    def busy_once(url, token, method="GET"):  # the endpoint's first answer never comes
        asked.append(url)
        if busy:
            busy.pop()
            raise urllib.error.URLError("timed out")
        return real(url, token, method)

    monkeypatch.setattr(watcher, "request", busy_once)
    monkeypatch.setattr(watcher.time, "sleep", lambda s: None)
    watcher.act(base, vm.metadata_token, {"action": "stop", "time": deadline.isoformat()})

    assert asked == [f"{base}/spot/acknowledge"] * 2
    said = capsys.readouterr().out
    assert "acknowledge not taken (<urlopen error timed out>); again in 2 s" in said
    assert said.rstrip().endswith("kumo-spot-watch: acknowledged")
    vm = fresh(vm)
    assert vm.eviction_acknowledged_at is not None and vm.task_state == VmTask.STOPPING
    assert (tmp_path / "run" / "spot-acknowledged").exists()

    # Stopped, the VM has no notice any more: the 404 is final, asked once.
    report(vm, "shutoff")
    assert fresh(vm).state == VmState.EVICTED
    asked.clear()
    assert watcher.acknowledge(base, vm.metadata_token, deadline.isoformat()) is False
    assert asked == [f"{base}/spot/acknowledge"]
    assert "acknowledge refused: HTTP Error 404" in capsys.readouterr().out
