"""The watcher Kumo ships into guests (``compute.drivers.spotwatch``), run here as the guest
runs it, against a live Kumo: its ``checkpoint`` command records the job's checkpoint."""

import importlib.util

import pytest

from compute import services
from compute.drivers import spotwatch
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
