"""Small things that make the portal read well: money with thousands separators, a launch
form that says to add an SSH key first, the dashboard's events explained, a favicon."""

from pathlib import Path

import pytest
from django.conf import settings

from tenants import billing
from tenants import services as tenants

pytestmark = pytest.mark.django_db


def test_money_and_points_have_thousands_separators(login, project, rate_card):
    billing.points_credit(project=project, amount=12345.5)
    html = login(project.owner).get(f"/p/{project.slug}/billing/").content.decode()
    assert 'id="points-balance">12,345.50<' in html


def test_the_launch_form_says_to_add_an_ssh_key_first(login, project, cloud):
    page = login(project.owner).get(f"/p/{project.slug}/vms/new/").content.decode()
    assert 'id="no-ssh-key"' in page and 'href="/account/ssh-keys/"' in page
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from tests.tenants.test_sshkeys import _openssh_public

    key = _openssh_public(ed25519.Ed25519PrivateKey.generate())
    tenants.sshkey_add(user=project.owner, name="laptop", public_key=key)
    again = login(project.owner).get(f"/p/{project.slug}/vms/new/").content.decode()
    assert 'id="no-ssh-key"' not in again


def test_the_dashboard_says_what_its_events_are_and_the_pages_have_an_icon(login, project):
    page = login(project.owner).get(f"/p/{project.slug}/").content.decode()
    assert "the same that webhooks receive" in page
    assert f'href="/p/{project.slug}/vms/new/"' in page  # nothing happened yet: launch one
    assert 'rel="icon"' in page
    icon = Path(settings.BASE_DIR) / "controlplane/static/portal/favicon.svg"
    assert icon.read_text().startswith("<svg")


def test_times_are_in_the_readers_time_zone_and_the_api_stays_utc(login, project, client_for):
    from datetime import UTC, datetime

    from controlplane.models import AuditEvent

    AuditEvent.objects.filter(project=project).update(at=datetime(2026, 1, 1, 3, 30, tzinfo=UTC))
    browser = login(project.owner)
    utc = browser.get(f"/p/{project.slug}/audit/").content.decode()
    assert "Times in UTC" in utc and "2026-01-01 03:30" in utc
    browser.cookies["kumo_tz"] = "Asia%2FTokyo"  # as the portal's script sets it
    tokyo = browser.get(f"/p/{project.slug}/audit/").content.decode()
    assert "Times in Asia/Tokyo" in tokyo and "2026-01-01 12:30" in tokyo
    browser.cookies["kumo_tz"] = "Mars/Olympus_Mons"  # no such zone: the site's
    assert "Times in UTC" in browser.get(f"/p/{project.slug}/audit/").content.decode()
    api = client_for(project.owner)
    api.cookies["kumo_tz"] = "Asia%2FTokyo"
    events = api.get(f"/api/v1/projects/{project.slug}/audit-events/").json()["results"]
    assert events[0]["at"].startswith("2026-01-01T03:30")
