"""Users for operators: list and search, create, see identities; deactivating ends the
user's sessions and revokes their tokens at once; reactivate. Operators only."""

import pytest
from django.test import Client

from tenants.models import ApiToken, ExternalIdentity
from tests.factories import UserFactory, token_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/admin/users/"


def test_operators_list_search_and_see_identities(client_for, staff):
    person = UserFactory(username="eri", organisation="Demo University")
    ExternalIdentity.objects.create(user=person, issuer="https://idp.example", subject="eri@x")
    ops = client_for(staff)
    found = ops.get(URL, {"q": "demo univ"}).json()
    assert [u["username"] for u in found["results"]] == ["eri"]
    detail = ops.get(f"{URL}eri/").json()
    assert detail["identities"][0]["issuer"] == "https://idp.example"
    assert detail["organisation"] == "Demo University" and detail["is_active"] is True


def test_only_operators(client_for):
    assert client_for(UserFactory()).get(URL).status_code == 403


def test_create_names_the_bad_field(client_for, staff):
    ops = client_for(staff)
    made = ops.post(URL, {"username": "newbie", "email": "n@example.org"}, format="json")
    assert made.status_code == 201 and made.json()["has_password"] is False
    again = ops.post(URL, {"username": "newbie"}, format="json")
    assert again.status_code in (400, 409) and "username" in again.json()["details"]
    numbers = ops.post(URL, {"username": 2400.0, "password": 7}, format="json")
    assert numbers.status_code == 400
    assert {"username", "password"} <= set(numbers.json()["details"])


def test_deactivate_ends_sessions_and_tokens_at_once(client_for, staff):
    person = UserFactory(username="gone")
    browser = Client()
    browser.force_login(person)
    assert browser.get("/api/v1/user/").status_code == 200
    api = client_for(person)
    assert api.get("/api/v1/user/").status_code == 200
    done = client_for(staff).post(f"{URL}gone/deactivate/", {"reason": "left"}, format="json")
    assert done.status_code == 200 and done.json()["is_active"] is False
    assert browser.get("/api/v1/user/").status_code in (401, 403)
    assert api.get("/api/v1/user/").status_code == 401
    assert not ApiToken.objects.filter(user=person, revoked_at__isnull=True).exists()
    back = client_for(staff).post(f"{URL}gone/reactivate/")
    assert back.json()["is_active"] is True
    assert client_for(person).get("/api/v1/user/").status_code == 200  # a new token works
    token_for(person)
