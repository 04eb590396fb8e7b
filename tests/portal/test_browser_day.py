"""A researcher's day and an operator's, in headless Chromium against a live Kumo (the
fixtures of ``test_browser``: gunicorn, the controller, beat and a simulated GPU host),
with moto's S3 + IAM server as the object store.

The researcher logs in, adds an SSH key, creates a network, launches a GPU VM and sees it
running without reloading, associates a global IP with it, attaches a volume, creates a
bucket and an S3 access key, reads the VM's Connect section and the billing page, and asks
for an external connection; the operator approves it and drains the host.

Each main page is kept as a screenshot at 1440 px and 390 px wide under
test-artifacts/portal/day/, and a page that scrolls sideways at 390 px or 360 px fails:
the portal works on a phone."""

import secrets

import pytest

from compute.choices import HostState
from compute.models import Host, VirtualMachine
from network.choices import ConnectionState
from network.models import ExternalConnection, GlobalIp
from storage.models import AccessKey, Bucket, Volume
from tenants import services as tenants
from tests.factories import make_pool
from tests.portal.test_browser import ARTIFACTS, browser, log_in, site  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DAY = ARTIFACTS / "day"
WIDE, PHONE, SMALL_PHONE = 1440, 390, 360
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0bXW1ZsJpEZx8o8DE2oqQxJgG6a4rGBpOIxYIJ2dJi ai@lab"
OVERFLOW = "document.documentElement.scrollWidth - window.innerWidth"


@pytest.fixture(autouse=True)
def object_store(s3_server, monkeypatch):
    """The web process's object store: the session's moto server (autouse, so it is in the
    environment before ``site`` starts gunicorn)."""
    monkeypatch.setenv("KUMO_OBJECT_STORE", "s3iam")
    monkeypatch.setenv("KUMO_OBJECT_STORE_ENDPOINT", s3_server["endpoint"])
    monkeypatch.setenv("KUMO_OBJECT_STORE_ACCESS_KEY", s3_server["access_key"])
    monkeypatch.setenv("KUMO_OBJECT_STORE_SECRET_KEY", s3_server["secret_key"])


def keep(page, name: str) -> None:
    """Screenshots of the page at 1440 px and 390 px; it must not scroll sideways at 390 px
    nor at 360 px (its tables scroll in their own box, its nav and forms wrap)."""
    DAY.mkdir(parents=True, exist_ok=True)
    height = page.viewport_size["height"] if page.viewport_size else 900
    try:
        for width in (WIDE, PHONE, SMALL_PHONE):
            page.set_viewport_size({"width": width, "height": height})
            if width != SMALL_PHONE:
                page.screenshot(path=str(DAY / f"{name}-{width}.png"), full_page=True)
            if width != WIDE:
                overflow = page.evaluate(OVERFLOW)
                assert overflow <= 0, f"{name} scrolls sideways by {overflow}px at {width} px"
    finally:
        page.set_viewport_size({"width": WIDE, "height": height})


def test_a_researchers_day_and_an_operators_at_two_widths(site, browser):  # noqa: F811
    from playwright.sync_api import expect

    base, project, fleet = site["url"], site["project"], site["fleet"]
    tenants.quota_set(project=project, storage_gib=1000, global_ips=4, buckets=4)
    make_pool()
    slug = project.slug
    page = browser.new_page()
    page.set_default_timeout(20_000)

    log_in(page, base, "alice")
    expect(page.locator("main table")).to_contain_text("Genome analysis lab")
    keep(page, "01-home")

    # An SSH key, for the VM to come.
    page.goto(f"{base}/account/ssh-keys/")
    page.fill("#id_name", "laptop")
    page.fill("#id_public_key", KEY)
    page.click("main form.stack button[type=submit]")
    expect(page.locator("#keys")).to_contain_text("laptop")
    keep(page, "02-ssh-keys")

    # A network.
    page.goto(f"{base}/p/{slug}/networks/")
    page.fill("#id_name", "lab")
    page.fill("#id_cidr", "10.0.0.0/24")
    page.click("#network-create button[type=submit]")
    expect(page.locator("#networks")).to_contain_text("10.0.0.0/24")
    keep(page, "03-networks")

    # A GPU VM; its page follows it to running without a reload.
    page.goto(f"{base}/p/{slug}/vms/new/")
    page.fill("#id_name", "train-1")
    page.select_option("#id_template", "gpu-1")
    page.select_option("#id_image", str(site["image"].pk))
    page.select_option("#id_network", label="lab (VNI 10000)")
    keep(page, "04-launch")
    page.click("#vm-create button[type=submit]")
    detail = page.url
    expect(page.locator("#vm-state")).to_have_attribute("data-state", "running", timeout=90_000)
    assert page.url == detail
    vm = VirtualMachine.objects.for_project(project).get(name="train-1")

    # A global IP, associated with the VM (1:1 NAT).
    page.goto(f"{base}/p/{slug}/global-ips/")
    page.click("form:has(input[name=form][value=allocate]) button[type=submit]")
    expect(page.locator("#addresses")).to_contain_text("198.51.100.")
    page.select_option("#associate [name=global_ip]", index=1)
    page.select_option("#associate [name=port]", index=1)
    page.click("#associate button[type=submit]")
    expect(page.locator("#addresses")).to_contain_text("train-1")
    address = GlobalIp.objects.for_project(project).get(port__vm=vm).address
    keep(page, "05-global-ips")

    # A volume, attached to the VM; a bucket and an S3 access key.
    page.goto(f"{base}/p/{slug}/storage/")
    volume_form = page.locator("form:has(input[name=form][value=volume])")
    volume_form.locator("[name=name]").fill("scratch")
    volume_form.locator("[name=size_gib]").fill("20")
    volume_form.locator("button[type=submit]").click()
    expect(page.locator("#volumes")).to_contain_text("scratch")
    page.locator("#volumes form:has(select[name=vm]) button[type=submit]").click()
    expect(page.locator("#volumes")).to_contain_text("train-1")
    assert Volume.objects.for_project(project).get(name="scratch").vm_id == vm.pk
    bucket_form = page.locator("form:has(input[name=form][value=bucket])")
    # Bucket names are global to the S3 server, which the session's other tests share.
    reads = f"day-reads-{secrets.token_hex(4)}"
    bucket_form.locator("[name=name]").fill(reads)
    bucket_form.locator("[name=quota_gib]").fill("50")
    bucket_form.locator("button[type=submit]").click()
    expect(page.locator("#buckets")).to_contain_text(reads)
    assert Bucket.objects.for_project(project).filter(name=reads).exists()
    page.fill("#access-key-create [name=description]", "pipeline")
    page.click("#access-key-create button[type=submit]")
    expect(page.locator("#access-key-secret")).to_be_visible()
    assert AccessKey.objects.for_project(project).filter(description="pipeline").exists()
    keep(page, "06-storage")

    # How to reach the VM: its Connect section names the global IP and an ssh command.
    page.goto(detail)
    expect(page.locator("#connect .global-ip")).to_have_text(address)
    expect(page.locator("#ssh-command")).to_contain_text(address)
    keep(page, "07-vm-detail")
    # Its NIC's security groups, on the port's own page.
    page.click('[data-nic="0"] a')
    expect(page.locator("#port-groups")).to_contain_text("default")
    expect(page.locator("#port-security")).to_be_visible()
    keep(page, "07b-port")

    # The bill: last month's invoice and this month's spend.
    page.goto(f"{base}/p/{slug}/billing/")
    expect(page.locator('#invoices a[href$=".csv"]')).to_have_count(1)
    keep(page, "08-billing")

    # A route to the campus network, waiting for an operator.
    page.goto(f"{base}/p/{slug}/connections/")
    page.fill("#connection-request [name=name]", "to-campus")
    page.select_option("#connection-request [name=kind]", "l3_route")
    page.fill("#connection-request [name=destination_cidr]", "172.16.0.0/16")
    page.fill("#connection-request [name=next_hop]", "10.0.0.254")
    page.click("#connection-request button[type=submit]")
    expect(page.locator("#connections")).to_contain_text("to-campus")
    keep(page, "09-connections")
    # The project's whole event feed.
    page.goto(f"{base}/p/{slug}/events/")
    expect(page.locator("#event-filter")).to_be_visible()
    keep(page, "09b-events")

    # Every page of the project fits a phone (those above are kept as screenshots).
    tabs = page.locator("nav.tabs a")
    for href in [tabs.nth(i).get_attribute("href") for i in range(tabs.count())]:
        page.goto(f"{base}{href}")
        for width in (PHONE, SMALL_PHONE):
            page.set_viewport_size({"width": width, "height": 900})
            assert page.evaluate(OVERFLOW) <= 0, f"{href} scrolls sideways at {width} px"
        page.set_viewport_size({"width": WIDE, "height": 900})

    # The operator's day: approve the connection, drain the host.
    browser.clear_cookies()
    log_in(page, base, "operator")
    page.goto(f"{base}/fleet/connections/")
    row = page.locator(f'[data-connection="{slug}/to-campus"]')
    keep(page, "10-fleet-connections")
    row.locator("button:not(.danger)[type=submit]").click()
    expect(page.locator("#reviewed")).to_contain_text("to-campus")
    connection = ExternalConnection.objects.get(name="to-campus")
    assert connection.state == ConnectionState.APPROVED

    page.goto(f"{base}/fleet/")
    host_row = page.locator('[data-host="gpu-01"]')
    host_row.locator("select[name=state]").select_option(HostState.DRAINING)
    host_row.locator("input[name=reason]").fill("firmware update")
    host_row.locator("button[type=submit]").click()
    expect(page.locator('[data-all-hosts="gpu-01"] .badge.draining')).to_have_count(1)
    assert Host.objects.get(name="gpu-01").state == HostState.DRAINING
    keep(page, "11-fleet")
    for path in ("/fleet/projects/", "/fleet/users/", "/fleet/leases/", "/applications/"):
        page.goto(f"{base}{path}")
        keep(page, "12-" + path.strip("/").replace("/", "-"))
    assert "Traceback" not in fleet.logs()
