"""``manage.py run`` stops cleanly and keeps its processes up (issue 13, faults 1 and 12): each
process runs under ``controlplane.supervise``, restarted with backoff when it exits and
stopped once on SIGTERM; stopping removes the router namespaces and the simulated fabric
the run made; the agent closes its hypervisor connection on shutdown."""

import os
import signal
import subprocess
import sys
import time
import uuid
import weakref

import pytest

from controlplane.management.commands import run
from controlplane.supervise import terminated_as_interrupted

PY = sys.executable


def _supervise(tmp_path, code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, "-m", "controlplane.supervise", "t", "--", PY, "-c", code],
        cwd=os.getcwd(),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_a_process_that_exits_is_restarted_with_backoff(tmp_path):
    starts = tmp_path / "starts"
    code = f"import sys; open({str(starts)!r}, 'a').write('x'); sys.exit(3)"
    proc = _supervise(tmp_path, code)
    deadline = time.monotonic() + 20  # starts at 0 s, then after 1 s and 2 s of backoff
    while time.monotonic() < deadline and len(starts.read_text() if starts.exists() else "") < 3:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert starts.read_text() == "xxx"
    assert err.count("exited with 3; restarting in") >= 2
    assert "restarting in 1 s" in err and "restarting in 2 s" in err


def test_sigterm_reaches_the_child_once_and_nothing_restarts(tmp_path):
    got = tmp_path / "got"
    code = (
        "import signal, sys, time\n"
        f"def term(*_):\n    open({str(got)!r}, 'a').write('T'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "while True: time.sleep(0.05)\n"
    )
    proc = _supervise(tmp_path, code)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)  # as honcho does: the supervisor's whole group
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert got.read_text() == "T"
    assert "restarting" not in err


def test_run_supervises_every_process():
    argv = run.supervised("controller", ["celery", "worker"])
    assert argv[1:5] == ["-m", "controlplane.supervise", "controller", "--"]
    assert argv[5:] == ["celery", "worker"]


@pytest.mark.django_db
def test_stopping_removes_the_router_namespaces_and_the_fabric(monkeypatch):
    from network import simfabric
    from network.drivers.base import router_netns
    from network.models import Router
    from tests.factories import make_project

    if not simfabric.available():
        pytest.skip("network namespaces need root")
    prefix = f"kt{uuid.uuid4().hex[:6]}"
    simfabric.ensure(["h1"], prefix=prefix)
    router = Router.objects.create(project=make_project())
    namespace = router_netns(router.pk.hex)
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        removed = run.cleanup(["h1"], simulated_network=True, prefix=prefix)
        assert removed == [namespace]
        left = os.listdir("/run/netns")
        assert namespace not in left
        assert not [n for n in left if n.startswith(prefix)]
    finally:
        subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
        simfabric.remove(["h1"], prefix=prefix)


def test_the_agent_closes_its_hypervisor_connection_on_shutdown(tmp_path, monkeypatch):
    from compute.drivers import simnode
    from compute.drivers.libvirt import LibvirtDriver
    from controlplane.agent import app as agent_app
    from controlplane.agent import runtime

    fleet = simnode.write_fleet(tmp_path / "fleet", 1, 0)
    hv = LibvirtDriver(f"test://{fleet['gpu-01']}")
    monkeypatch.setattr(runtime, "_hypervisor", hv)
    conn = hv._conn
    agent_app._close_drivers()
    assert runtime._hypervisor is None
    assert conn._o is None  # closed: nothing left for virConnect.__del__ at exit


class _Held:
    """An object whose finalizer is where the SIGTERM lands."""


def test_a_sigterm_landing_in_a_finalizer_still_ends_the_block():
    """Python drops an exception raised in a finalizer: the SIGTERM is held and raised just
    after, out of it, and the block still ends as Ctrl-C would."""
    previous = signal.getsignal(signal.SIGALRM), signal.getsignal(signal.SIGTERM)
    ran_on = []
    with pytest.raises(SystemExit) as stopped, terminated_as_interrupted():
        held = _Held()
        weakref.finalize(held, os.kill, os.getpid(), signal.SIGTERM)
        del held  # the finalizer runs here, and the signal's handler inside it
        ran_on.append("after the finalizer")  # the program goes on a moment
        time.sleep(30)  # ended by the held SIGTERM, not slept through
    assert stopped.value.code == 128 + signal.SIGTERM
    assert ran_on == ["after the finalizer"]
    assert (signal.getsignal(signal.SIGALRM), signal.getsignal(signal.SIGTERM)) == previous


def test_a_sigterm_elsewhere_ends_the_block_at_once():
    with pytest.raises(SystemExit) as stopped, terminated_as_interrupted():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    assert stopped.value.code == 128 + signal.SIGTERM
