"""SAML login in a real browser (Debian's headless Chromium, driven by Playwright): the
login page's "Log in with your institution", the searchable discovery page, the demo IdP's
page, and back logged in; the second time the discovery page remembers the institution."""

from pathlib import Path

import pytest

from tenants.models import ExternalIdentity
from tests.portal.test_browser import CHROMIUM, CHROMIUM_ARGS, playwright

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "federation"


@pytest.fixture
def chromium(tmp_path, monkeypatch):
    with playwright(monkeypatch) as session:
        context = session.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1100, "height": 800},
        )
        yield context
        context.close()


def test_log_in_with_your_institution_in_chromium(kumo_site, idp, chromium):
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{kumo_site}/login/")
    page.click("#login-institution")
    page.fill("#idp-search", "kyushu")
    expect(page.locator("#idp-list li", has_text="Osaka")).to_be_hidden()
    expect(page.locator("#idp-list li", has_text="Kyushu")).to_be_visible()
    page.fill("#idp-search", "127.0.0.1")  # the demo IdP's entity id
    expect(page.locator("#idp-list li", has_text="Kyushu")).to_be_hidden()
    page.screenshot(path=str(ARTIFACTS / "discovery.png"))
    page.click("#idp-list a.idp >> text=Demo University")
    expect(page.locator("h1")).to_have_text("Demo University")  # the IdP's own page
    page.select_option("#username", "alice")
    page.click("button[type=submit]")
    page.wait_for_url(f"{kumo_site}/")
    identity = ExternalIdentity.objects.get()
    expect(page.locator("header.top")).to_contain_text(identity.user.username)
    page.screenshot(path=str(ARTIFACTS / "logged-in.png"))
    # log out; the next time the discovery page offers the same institution first
    page.click("header.top button.link")
    page.goto(f"{kumo_site}/login/institution/")
    page.click("#remembered-idp")
    page.click("button[type=submit]")
    page.wait_for_url(f"{kumo_site}/")
    assert ExternalIdentity.objects.count() == 1
