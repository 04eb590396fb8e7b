"""The second factor: enrolment from the account page (QR code), login with a code, a wrong
code refused and throttled, a recovery code that works once; the API login asks for it;
operators can require it; API tokens are unchanged."""

import re
import time

import pytest
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from tenants import mfa
from tests.factories import UserFactory, token_for

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-enough-password-1"


def code_for(device, offset=0) -> str:
    value = totp(device.bin_key, step=device.step, t0=device.t0, digits=6, drift=offset)
    return f"{value:06d}"


@pytest.fixture
def person():
    user = UserFactory(username="dana")
    user.set_password(PASSWORD)
    user.save()
    return user


def enrol(client, user) -> list[str]:
    assert client.post("/account/second-factor/", {"step": "begin"}).status_code == 302
    page = client.get("/account/")
    assert "<svg" in page.content.decode() and 'id="totp-secret"' in page.content.decode()
    device = TOTPDevice.objects.get(user=user, confirmed=False)
    client.post("/account/second-factor/", {"step": "confirm", "code": code_for(device)})
    page = client.get("/account/").content.decode()
    codes = re.search(r'<pre id="recovery-codes">(.*?)</pre>', page, re.S).group(1).split()
    assert len(codes) == mfa.RECOVERY_CODES
    assert "recovery-codes" not in client.get("/account/").content.decode()  # shown once
    return codes


def password_step(client, user=None):
    response = client.post("/login/", {"username": "dana", "password": PASSWORD})
    assert response.status_code == 302
    return response


def test_enrol_then_log_in_with_a_code(person):
    client = Client()
    client.force_login(person)
    enrol(client, person)
    assert mfa.has_totp(person)
    device = TOTPDevice.objects.get(user=person)
    device.refresh_from_db()

    fresh = Client()
    step = password_step(fresh)
    assert step["Location"] == "/login/verify/"
    assert fresh.get("/").status_code == 302  # not logged in by the password alone
    # the code enrolment used is spent (django-otp refuses a code twice); use the next one
    done = fresh.post("/login/verify/", {"code": code_for(device, offset=1)})
    assert done.status_code == 302 and done["Location"] == "/"
    assert fresh.get("/").status_code == 200


def test_a_wrong_code_is_refused_and_throttled(person):
    client = Client()
    client.force_login(person)
    enrol(client, person)
    device = TOTPDevice.objects.get(user=person)
    fresh = Client()
    password_step(fresh)
    wrong = fresh.post("/login/verify/", {"code": "000000"})
    assert wrong.status_code == 400 and b"Wrong code" in wrong.content
    # right away, even the right code is refused: the device waits after a failure
    throttled = fresh.post("/login/verify/", {"code": code_for(device, offset=1)})
    assert throttled.status_code == 429 and b"Too many wrong codes" in throttled.content
    assert fresh.get("/").status_code == 302
    denied = AuditEvent.objects.filter(action="user.second_factor", outcome=AuditOutcome.DENIED)
    assert denied.count() == 2
    time.sleep(2.1)  # the first failure's wait (1 s) is over
    ok = fresh.post("/login/verify/", {"code": code_for(device, offset=1)})
    assert ok.status_code == 302


def test_a_recovery_code_works_once(person):
    client = Client()
    client.force_login(person)
    codes = enrol(client, person)
    first = Client()
    password_step(first)
    assert first.post("/login/verify/", {"code": codes[0]}).status_code == 302
    assert mfa.recovery_codes_left(person) == mfa.RECOVERY_CODES - 1
    again = Client()
    password_step(again)
    refused = again.post("/login/verify/", {"code": codes[0]})
    assert refused.status_code == 400


def test_the_api_login_asks_for_the_code_and_tokens_are_unchanged(person, client_for):
    device = TOTPDevice.objects.create(user=person, name="a", confirmed=True)
    api = client_for(None)
    body = {"username": "dana", "password": PASSWORD}
    missing = api.post("/api/v1/auth/login/", body, format="json")
    assert missing.status_code == 400 and missing.json()["code"] == "second_factor_required"
    assert "otp" in missing.json()["details"]
    ok = api.post("/api/v1/auth/login/", {**body, "otp": code_for(device)}, format="json")
    assert ok.status_code == 200
    assert client_for(person).get("/api/v1/user/").status_code == 200  # a bearer token
    token_for(person)


def test_operators_can_require_it_for_staff(person, settings):
    settings.REQUIRE_TOTP = "staff"
    person.is_staff = True
    person.save()
    client = Client()
    password_step(client)
    held = client.get("/")
    assert held.status_code == 302 and held["Location"] == "/account/"
    enrol(client, person)
    assert client.get("/").status_code == 200
    # a federated user (no password) is never held
    federated = UserFactory(is_staff=True)
    federated.set_unusable_password()
    federated.save()
    assert not mfa.required_for(federated)


def test_required_for_everyone_with_a_password(person, settings):
    settings.REQUIRE_TOTP = "password"
    assert mfa.required_for(person)
    settings.REQUIRE_TOTP = ""
    assert not mfa.required_for(person)
