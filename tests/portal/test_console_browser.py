"""The portal's Console page in a real browser against a real guest: headless Chromium
(Debian's, driven by Playwright) on the web process and the console proxy as ``manage.py
run`` starts them (gunicorn, ``manage.py console-proxy``), and the busybox QEMU guest of
``test_console_qemu`` with a shell on ttyS0. The member logs in, opens the VM's Console
page, whose script gets a token from the portal and opens the proxy's websocket in
xterm.js; a command typed into the terminal comes back evaluated by the guest."""

import dataclasses
import os
import socket
import sys

import pytest
from django.conf import global_settings

from compute.choices import VmState, VmTask
from compute.models import Host, VirtualMachine
from controlplane.management.commands.run import topology
from controlplane.models import AuditEvent
from tenants import services as tenants
from tests.compute import test_console_qemu as qemu
from tests.compute.test_console_qemu import guest  # noqa: F401 (the fixture)
from tests.compute.test_consoleproxy import _shell_on_the_console  # noqa: F401 (autouse)
from tests.e2e.processes import Fleet, database_url, free_port, wait_for
from tests.factories import make_host, make_vm
from tests.portal.test_browser import CHROMIUM, playwright

pytestmark = [pytest.mark.e2e, pytest.mark.kvm_tcg, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct-horse-battery-staple"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def site(tmp_path, settings):
    """gunicorn and the console proxy, as ``manage.py run`` starts them."""
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS  # the web process checks
    web, proxy = free_port(), free_port()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL="filesystem://",
        KUMO_VAR_DIR=str(tmp_path),
        KUMO_CONSOLE_PROXY_URL=f"ws://127.0.0.1:{proxy}/",
        DATABASE_TEST_NAME="",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    fleet = Fleet(env, tmp_path)
    processes = topology(
        sys.executable, bind=f"127.0.0.1:{web}", hosts=[], console_bind=f"127.0.0.1:{proxy}"
    )
    for name in ("web", "console-proxy"):
        fleet.start(name, processes[name])
    try:
        for port in (web, proxy):
            wait_for(lambda p=port: _listening(p), timeout=60, what=f"port {port}", fleet=fleet)
        yield {"url": f"http://127.0.0.1:{web}", "fleet": fleet}
    finally:
        fleet.stop()


@pytest.fixture
def browser(monkeypatch):
    with playwright(monkeypatch) as session:
        chromium = session.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True
        )
        yield chromium
        chromium.close()


def test_typing_into_the_console_page_reaches_the_guests_shell(
    guest,  # noqa: F811
    site,
    browser,
    project,
):
    driver, spec, boot_token = guest
    owner = project.owner
    owner.set_password(PASSWORD)
    owner.save()
    tenants.quota_set(project=project, vcpus=64, memory_gib=256, vms=10)
    host = make_host("cpu-07", kind="cpu")
    Host.objects.filter(pk=host.pk).update(libvirt_uri=qemu.URI)
    vm = make_vm(project)
    VirtualMachine.objects.filter(pk=vm.pk).update(
        state=VmState.RUNNING, task_state=VmTask.NONE, host=host
    )
    spec = dataclasses.replace(spec, vm_id=str(vm.pk))
    driver.ensure_defined(spec)
    try:
        driver.ensure_running(spec.vm_id)
        qemu._wait_for(driver, spec.vm_id, f"{qemu.MARKER} {boot_token}", 1)

        page = browser.new_page()
        page.goto(f"{site['url']}/login/")
        page.fill("#id_username", owner.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.goto(f"{site['url']}/p/{project.slug}/vms/{vm.pk}/")
        page.click('a:text-is("Console")')
        page.wait_for_selector("#console-status:has-text('Connected')", timeout=15000)
        page.click("#console-terminal")
        page.keyboard.type("echo KUMO-$((40+2))\n")
        page.wait_for_selector(".xterm-rows:has-text('KUMO-42')", timeout=30000)
        page.close()
    finally:
        driver.ensure_absent(spec.vm_id)
    connected = AuditEvent.objects.get(action="vm.console_connect")
    assert connected.outcome == "success" and connected.actor == owner
