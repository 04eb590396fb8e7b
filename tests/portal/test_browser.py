"""The portal in a real browser: headless Chromium (Debian's, driven by Playwright) against
gunicorn, the controller, beat and a simulated 8x A100 host's agent on the filesystem
broker. A member logs in, creates a network, launches a GPU VM and watches it reach running
(htmx polling), opens port 22 in a security group, uploads an image (its progress shown)
and downloads last month's invoice as CSV;
an operator looks at the fleet. Screenshots of each step go to test-artifacts/portal/."""

import hashlib
import os
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import global_settings
from django.db import connections
from django.utils import timezone

from compute.choices import HostState
from compute.management.commands.simfleet import write_and_register
from compute.models import Host, Image, VirtualMachine
from network.models import SecurityGroupRule
from tenants import billing
from tenants import services as tenants
from tests.e2e.processes import ROOT, Fleet, database_url, free_port, start_topology, wait_for
from tests.factories import UserFactory, make_image, make_project, make_template
from tests.portal.conftest import PRICES

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts" / "portal"
PASSWORD = "correct-horse-battery-staple"
HOSTS = ["gpu-01"]


@contextmanager
def playwright(monkeypatch):
    """Playwright's sync API for Debian's Chromium (a skip without it; never a downloaded
    browser). Its event loop runs in this thread, so the test's own ORM calls (fixtures,
    checks) are allowed as the plain synchronous code they are, but run in a context of
    their own, with a connection pytest-django does not close: closed on the way out, so
    the test database can be dropped at the end of the run."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no {CHROMIUM}: `make install` installs Debian's chromium")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as session:
        try:
            yield session
        finally:
            connections.close_all()


@pytest.fixture
def browser(site, tmp_path, monkeypatch):
    """Debian's Chromium, headless, with a fresh profile; never a downloaded browser. It
    closes before the site stops, so no open connection holds the web server up."""
    with playwright(monkeypatch) as session:
        context = session.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            accept_downloads=True,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()


@pytest.fixture
def site(tmp_path, settings):
    """The running topology on the filesystem broker, and the people and data of the tour."""
    # Real password hashes: the web process verifies them with the default hashers.
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL="filesystem://",
        KUMO_VAR_DIR=str(tmp_path),
        KUMO_HEARTBEAT_INTERVAL_S="1",
        KUMO_GUESTS_REPORT_INTERVAL_S="2",
        KUMO_RECONCILE_GRACE_S="1",
        DATABASE_TEST_NAME="",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    fleet = Fleet(env, tmp_path)
    uris = write_and_register(tmp_path / "fleet", HOSTS)
    port = free_port()
    start_topology(fleet, bind=f"127.0.0.1:{port}", hosts=HOSTS, uris=uris)

    alice = UserFactory(username="alice")
    alice.set_password(PASSWORD)
    alice.save()
    admin = UserFactory(username="operator", is_staff=True)
    admin.set_password(PASSWORD)
    admin.save()
    project = make_project(owner=alice, slug="genome-lab", name="Genome analysis lab")
    tenants.quota_set(project=project, vcpus=256, memory_gib=2048, gpus=8, vms=10)
    billing.rate_card_create(valid_from=timezone.now().replace(year=2020), prices=PRICES)
    last_month = billing.month_start(billing.month_start(timezone.now().date()) - timedelta(days=1))
    [invoice] = billing.invoices_issue(period=last_month, projects=[project])
    template = make_template(gpus=1, name="gpu-1")
    image = make_image(name="ubuntu-24.04")

    def hosts_ready():
        return Host.objects.filter(
            name__in=HOSTS, state=HostState.UP, guests_reported_at__isnull=False
        ).count() == len(HOSTS)

    try:
        wait_for(hosts_ready, timeout=90, what="the agent up and reporting", fleet=fleet)
        yield {
            "url": f"http://127.0.0.1:{port}",
            "fleet": fleet,
            "project": project,
            "invoice": invoice,
            "template": template,
            "image": image,
        }
    finally:
        fleet.stop()


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")


def test_a_member_launches_a_vm_opens_a_port_and_downloads_an_invoice(site, browser):
    from playwright.sync_api import expect

    base, project, fleet = site["url"], site["project"], site["fleet"]
    page = browser.new_page()
    page.set_default_timeout(20_000)

    log_in(page, base, "alice")
    expect(page.locator("main table")).to_contain_text("Genome analysis lab")  # her projects
    page.select_option("#switch-project", project.slug)  # the switcher opens the dashboard
    expect(page).to_have_url(f"{base}/p/{project.slug}/")
    expect(page.locator("h1")).to_contain_text("Genome analysis lab")

    # A network with a subnet.
    page.click("nav.tabs >> text=Networks")
    page.fill("#id_name", "lab")
    page.fill("#id_cidr", "10.0.0.0/24")
    page.click("#network-create button[type=submit]")
    expect(page.locator("#networks")).to_contain_text("10.0.0.0/24")

    # Launch from a template: the form shows the price per hour and the quota left.
    page.click("nav.tabs >> text=VMs")
    page.click("text=Launch a VM")
    expect(page.locator('[data-template="gpu-1"] .price')).to_have_text("745.50 JPY")
    page.fill("#id_name", "train-1")
    page.select_option("#id_template", "gpu-1")
    page.select_option("#id_image", str(site["image"].pk))
    page.select_option("#id_network", label="lab (VNI 10000)")
    shot(page, "1-launch")
    page.click("#vm-create button[type=submit]")

    # The detail page polls its state until the host agent reports the guest running.
    expect(page.locator("#vm-state")).to_have_attribute("data-state", "running", timeout=90_000)
    expect(page.locator("#gpus")).to_contain_text("gpu")
    expect(page.locator("#nccl")).to_contain_text("numaid")
    shot(page, "2-vm-running")
    vm = VirtualMachine.objects.for_project(project).get(name="train-1")
    assert vm.host.name == "gpu-01"
    # Stop it: the badge, the note and the buttons follow the state without a reload.
    page.click('#vm-actions [data-action="stop"]')
    expect(page.locator("#vm-flash")).to_contain_text("Stop of VM train-1 requested")
    expect(page.locator("#vm-state")).to_have_attribute("data-state", "stopped", timeout=60_000)
    expect(page.locator('#vm-actions [data-action="start"]')).to_be_visible()
    expect(page.locator('#vm-actions [data-action="stop"]')).to_have_count(0)
    expect(page.locator("#vm-flash")).to_contain_text("VM train-1 is stopped.")
    page.click('#vm-actions [data-action="start"]')
    expect(page.locator("#vm-state")).to_have_attribute("data-state", "running", timeout=60_000)
    expect(page.locator('#vm-actions [data-action="stop"]')).to_be_visible()
    page.click("nav.tabs >> text=VMs")
    expect(page.locator('[data-vm="train-1"] [data-state]')).to_have_text("running")
    shot(page, "3-vm-list")

    # Open port 22 in the default security group.
    page.click("nav.tabs >> text=Security groups")
    page.click("text=default")
    page.select_option("#id_protocol", "tcp")
    page.fill("#id_port_min", "22")
    page.fill("#id_remote_cidr", "0.0.0.0/0")
    page.click("#rule-create button[type=submit]")
    expect(page.locator("#rules")).to_contain_text("0.0.0.0/0")
    assert SecurityGroupRule.objects.for_project(project).filter(port_min=22).exists()
    shot(page, "4-security-group")

    # An image of her own, its upload's progress shown as it is sent. A form the server
    # refuses (a login user that is no user name) comes back in place with the field's
    # error (a 400, swapped in by htmx); the right one replaces the page with the list and
    # its message.
    page.click("nav.tabs >> text=Images")
    page.evaluate(
        """() => { window.uploadSent = [];
          document.addEventListener("htmx:beforeSend", (e) => e.detail.xhr.upload
            .addEventListener("progress", (p) => window.uploadSent.push([p.loaded, p.total])));
        }"""
    )
    disk = bytes(range(256)) * (32 << 10)  # 8 MiB
    upload = {"name": "scratch.raw", "mimeType": "application/octet-stream", "buffer": disk}
    page.fill("#id_name", "scratch")
    page.fill("#id_os_distro", "debian")
    page.select_option("#id_format", "raw")
    page.fill("#id_login_user", "root!")
    page.set_input_files("#id_file", files=[upload])
    page.click("#image-upload button[type=submit]")
    expect(page.locator('#image-upload [data-field="login_user"]')).to_be_visible()
    expect(page).to_have_url(f"{base}/p/{project.slug}/images/")
    page.fill("#id_login_user", "debian")
    page.set_input_files("#id_file", files=[upload])
    # Sent at 4 MiB/s, as from a researcher's office: the bar moves while the bytes go.
    network = browser.new_cdp_session(page)
    network.send("Network.enable")
    slow = {"offline": False, "latency": 0, "downloadThroughput": -1}
    network.send("Network.emulateNetworkConditions", slow | {"uploadThroughput": 4 << 20})
    page.click("#image-upload button[type=submit]")
    expect(page.locator("#image-upload [role=status]")).to_contain_text("% sent")
    expect(page.locator("#image-upload button[type=submit]")).to_be_disabled()
    shot(page, "4a-image-uploading")
    expect(page.locator("ul.messages")).to_contain_text("Image scratch uploaded")
    network.send("Network.emulateNetworkConditions", slow | {"uploadThroughput": -1})
    expect(page.locator("#images")).to_contain_text("scratch")
    sent = page.evaluate("window.uploadSent")  # the page was swapped, not loaded again
    assert sent and sent[-1][0] == sent[-1][1] > len(disk), sent
    image = Image.objects.get(project=project, name="scratch")
    assert image.checksum == "sha256:" + hashlib.sha256(disk).hexdigest()
    shot(page, "4b-image-uploaded")
    # Deleting it asks first: dismissed, nothing is sent; accepted, it goes.
    questions = []

    def answer(dialog, accept):
        questions.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda dialog: answer(dialog, False))
    page.click('#images tr:has-text("scratch") button.danger')
    expect(page.locator("#images")).to_contain_text("scratch")
    assert Image.objects.get(pk=image.pk).state == "active"
    page.once("dialog", lambda dialog: answer(dialog, True))
    page.click('#images tr:has-text("scratch") button.danger')
    expect(page.locator("ul.messages")).to_contain_text("Image scratch deleted.")
    assert Image.objects.get(pk=image.pk).state == "deleted"
    assert questions == ["Delete image scratch? Its file goes from the image store."] * 2

    # Last month's invoice, as CSV.
    page.click("nav.tabs >> text=Billing")
    with page.expect_download() as download:
        page.click("#invoices >> text=CSV")
    saved = ARTIFACTS / download.value.suggested_filename
    download.value.save_as(str(saved))
    assert saved.read_text() == billing.invoice_csv(site["invoice"].document)
    shot(page, "5-billing")

    page.click("nav.tabs >> text=Dashboard")
    expect(page.locator("#running-vms")).to_have_text("1")
    shot(page, "6-dashboard")

    # The operator's fleet view: the VM's GPU is one on-demand cell of gpu-01's grid.
    browser.clear_cookies()
    log_in(page, base, "operator")
    page.goto(f"{base}/fleet/")
    expect(page.locator('[data-host="gpu-01"] [data-occupancy="on_demand"]')).to_have_count(1)
    expect(page.locator('[data-host="gpu-01"] [data-occupancy="free"]')).to_have_count(7)
    shot(page, "7-fleet")
    assert "Traceback" not in fleet.logs()
