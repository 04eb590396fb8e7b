"""The operators' users page: search, identities, deactivate (sessions and tokens end at
once) and reactivate; nobody else sees it."""

import pytest
from django.test import Client

from controlplane.models import AuditEvent
from tenants.models import ApiToken, ExternalIdentity
from tests.factories import UserFactory, token_for

pytestmark = pytest.mark.django_db

URL = "/fleet/users/"


def test_operators_search_and_see_identities(login, staff):
    eri = UserFactory(username="eri", organisation="Demo University", email="eri@demo.example")
    ExternalIdentity.objects.create(user=eri, issuer="https://idp.demo.example", subject="e@x")
    UserFactory(username="kenji", organisation="Another Institute")
    page = login(staff).get(URL, {"q": "demo univ"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-user="eri"' in html and "https://idp.demo.example" in html
    assert 'data-user="kenji"' not in html


def test_the_page_does_not_exist_for_anyone_else(login, project):
    owner = login(project.owner)
    assert owner.get(URL).status_code == 404
    assert owner.post(f"{URL}{project.owner.username}/deactivate/").status_code == 404
    assert project.owner.is_active


def test_deactivate_ends_sessions_and_tokens_then_reactivate(login, staff):
    person = UserFactory(username="gone")
    token_for(person)
    browser = Client()
    browser.force_login(person)
    assert browser.get("/api/v1/user/").status_code == 200
    ops = login(staff, csrf=False)
    done = ops.post(f"{URL}gone/deactivate/", {"reason": "left the lab", "q": "go"})
    assert done.status_code == 302 and done["Location"] == f"{URL}?q=go"
    person.refresh_from_db()
    assert not person.is_active
    assert browser.get("/api/v1/user/").status_code in (401, 403)
    assert not ApiToken.objects.filter(user=person, revoked_at__isnull=True).exists()
    event = AuditEvent.objects.get(action="user.deactivate", object_id=str(person.pk))
    assert event.detail["reason"] == "left the lab" and event.actor == staff
    assert "deactivated" in ops.get(URL, {"q": "gone"}).content.decode()
    ops.post(f"{URL}gone/reactivate/")
    person.refresh_from_db()
    assert person.is_active


def test_an_operator_cannot_lock_themself_out(login, staff):
    answer = login(staff).post(f"{URL}{staff.username}/deactivate/", follow=True)
    assert "cannot lock yourself out" in answer.content.decode()
    staff.refresh_from_db()
    assert staff.is_active


def test_an_unknown_user_is_a_404(login, staff):
    assert login(staff).post(f"{URL}nobody/reactivate/").status_code == 404
