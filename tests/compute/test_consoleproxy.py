"""The console proxy (``compute.consoleproxy``) for real: the proxy serving on a free
loopback port in a thread, a real websocket client (websockify's own), tokens from the API.

The happy path boots the busybox guest of ``test_console_qemu`` under libvirtd (its
``/init`` runs a shell on ttyS0 here), points a VM row at it, and types a command into the
guest's shell through the proxy. The refusals (origin, path, token) need no guest.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest
from websockify.websocket import WebSocket

from compute.choices import VmState, VmTask
from compute.consoleproxy import ConsoleProxyServer, origin_allowed
from compute.models import Host, VirtualMachine
from tenants import services as tenants
from tests.compute import test_console_qemu as qemu
from tests.compute.test_console_qemu import guest  # noqa: F401 (the fixture)
from tests.factories import make_host, make_vm

# The proxy's threads read what the test wrote: committed rows, not a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


class Client(WebSocket):
    """websockify's websocket client, sending the URL's query too (its ``connect`` sends
    the path alone), and reading the frames that came in the same packet as the handshake's
    answer (its ``connect`` keeps them buffered, undecoded, and the next read waits for the
    socket: a close frame sent at once, as a refusal is, would be missed)."""

    def open(self, url: str, *, origin: str | None = None, timeout_s: float = 10) -> Client:
        self._target = urlsplit(url)
        self.connect(url, origin=origin)
        self.socket.settimeout(timeout_s)
        while (frame := self._decode_hybi(self._recv_buffer)) is not None:
            self._recv_buffer = self._recv_buffer[frame["length"] :]
            self._recv_queue.append(frame)
        return self

    def send_request(self, type, path):
        query = f"?{self._target.query}" if self._target.query else ""
        super().send_request(type, f"{path}{query}")

    def read_until(self, needle: bytes, *, timeout_s: float, poke: bytes = b"") -> bytes:
        """Everything received until ``needle`` shows up; ``poke`` is sent each quiet second."""
        got, deadline = b"", time.monotonic() + timeout_s
        self.socket.settimeout(1)
        while needle not in got:
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not received; got {got[-2000:]!r}")
            try:
                chunk = self.recvmsg()
            except TimeoutError:
                if poke:
                    self.sendmsg(poke)
                continue
            if chunk is None:
                raise AssertionError(f"closed ({self.close_code} {self.close_reason}): {got!r}")
            got += chunk
        return got

    def refusal(self) -> tuple[int, str]:
        """The close code and reason the proxy ended the session with."""
        while self.recvmsg() is not None:
            pass
        return self.close_code, self.close_reason


@pytest.fixture(autouse=True)
def _shell_on_the_console(monkeypatch):
    """The busybox guest's ``/init`` ends in a shell on its console instead of a sleep
    (set before the ``guest`` fixture writes the initramfs)."""
    assert "$bb sleep 120\n" in qemu.INIT
    monkeypatch.setattr(qemu, "INIT", qemu.INIT.replace("$bb sleep 120\n", "exec $bb sh\n"))


@pytest.fixture
def proxy(settings):
    """The proxy on a free loopback port; the API advertises it."""
    server = ConsoleProxyServer("127.0.0.1", 0)
    port = server.server_address[1]
    settings.CONSOLE_PROXY_URL = f"ws://127.0.0.1:{port}/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield port
    server.shutdown()
    server.server_close()


@pytest.fixture
def api(client_for, project):
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    return client_for(project.owner)


def _running_vm(project, *, uri="qemu:///system"):
    host = Host.objects.filter(name="cpu-07").first() or make_host("cpu-07", kind="cpu")
    Host.objects.filter(pk=host.pk).update(libvirt_uri=uri)
    vm = make_vm(project)
    VirtualMachine.objects.filter(pk=vm.pk).update(
        state=VmState.RUNNING, task_state=VmTask.NONE, host=host
    )
    return VirtualMachine.objects.get(pk=vm.pk)


def _ticket(api, project, vm) -> dict:
    answer = api.post(f"/api/v1/projects/{project.slug}/vms/{vm.pk}/console/")
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_origins_are_the_portals_own(settings):
    settings.ALLOWED_HOSTS = ["kumo.example.ac.jp", "localhost"]
    settings.CONSOLE_ALLOWED_ORIGINS = [".console.example.ac.jp"]
    assert origin_allowed(None)  # not a browser: the token alone decides
    assert origin_allowed("https://kumo.example.ac.jp")
    assert origin_allowed("http://localhost:8000")
    assert origin_allowed("https://a.console.example.ac.jp")
    assert not origin_allowed("https://evil.example.com")
    assert not origin_allowed("null")


def test_the_proxy_refuses_a_foreign_origin_before_the_upgrade(api, project, proxy):
    ticket = _ticket(api, project, _running_vm(project))
    with pytest.raises(Exception, match="denied: 403"):
        Client().open(ticket["url"], origin="https://evil.example.com")
    # The token was not spent by the refused handshake: it still gets as far as the host
    # (which has no such guest).
    assert Client().open(ticket["url"]).refusal()[0] == 1011


@pytest.mark.parametrize("case", ["tampered", "other vm", "no token", "reused"])
def test_the_proxy_closes_refused_sessions_with_the_reason(api, project, proxy, case):
    vm = _running_vm(project)
    ticket = _ticket(api, project, vm)
    url = ticket["url"]
    if case == "tampered":
        url = url[:-3] + ("xyz" if not url.endswith("xyz") else "abc")
    elif case == "other vm":
        url = url.replace(str(vm.pk), "00000000-0000-4000-8000-000000000000")
    elif case == "no token":
        url = url.split("?")[0]
    elif case == "reused":
        # The first use is spent even though it fails later (no such guest on libvirtd).
        first = Client().open(url)
        assert first.refusal()[0] == 1011
    code, reason = Client().open(url).refusal()
    assert code == 1008, (code, reason)
    expected = {
        "tampered": "token: unknown",
        "other vm": "token: issued for another VM",
        "no token": "token: missing",
        "reused": "token: used already",
    }[case]
    assert reason.startswith(expected), reason


def test_a_guest_the_host_does_not_have_is_an_error_close(api, project, proxy):
    vm = _running_vm(project)
    ticket = _ticket(api, project, vm)
    code, reason = Client().open(ticket["url"]).refusal()
    assert code == 1011 and "console unavailable" in reason


@pytest.mark.kvm_tcg
def test_a_shell_on_a_real_guests_console_through_the_proxy(
    api,
    project,
    proxy,
    guest,  # noqa: F811 (the imported fixture)
):
    """Token from the API, websocket to the proxy, libvirt console stream to a real QEMU
    guest: a command typed into the guest's shell comes back evaluated."""
    driver, spec, boot_token = guest
    vm = _running_vm(project, uri=qemu.URI)
    spec = dataclasses.replace(spec, vm_id=str(vm.pk))
    driver.ensure_defined(spec)
    try:
        driver.ensure_running(spec.vm_id)
        qemu._wait_for(driver, spec.vm_id, f"{qemu.MARKER} {boot_token}", 1)

        ticket = _ticket(api, project, vm)
        session = Client().open(ticket["url"], origin="http://localhost:8000")
        session.sendmsg(b"echo KUMO-$((40+2))\n")
        got = session.read_until(b"KUMO-42", timeout_s=30, poke=b"\n")
        assert b"echo KUMO-$((40+2))" in got  # the guest's tty echoed what was typed
        session.close()
        # The console log kept logging meanwhile (the same serial port, its <log> intact);
        # its file is written a moment after the stream is (later on a loaded machine).
        qemu._wait_for(driver, spec.vm_id, "KUMO-42", 1, timeout_s=30)
    finally:
        driver.ensure_absent(spec.vm_id)


def test_manage_py_console_proxy_serves_and_stops_on_sigterm(tmp_path):
    """The process ``manage.py run`` and the systemd unit start: it listens on ``--bind``,
    answers websockets (a URL without a token is refused before any database work) and
    exits on SIGTERM."""
    from controlplane.management.commands.run import topology
    from tests.e2e.processes import ROOT, free_port

    bind = f"127.0.0.1:{free_port()}"
    argv = topology(sys.executable, bind="127.0.0.1:1", hosts=[], console_bind=bind)
    env = {**os.environ, "KUMO_VAR_DIR": str(tmp_path)}
    log = (tmp_path / "proxy.log").open("w")
    proc = subprocess.Popen(argv["console-proxy"], cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                session = Client().open(f"ws://{bind}/vms/{'0' * 8}-0000-4000-8000-{'0' * 12}/")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "proxy.log"
                ).read_text()
                time.sleep(0.2)
        assert session.refusal() == (1008, "token: missing or malformed")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
