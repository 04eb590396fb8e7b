"""Logins and failed logins are in the audit trail, whichever door they came through."""

import pytest
from rest_framework.test import APIClient

from controlplane.models import AuditEvent
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-staple"


def test_api_login_and_a_failed_one_are_audited():
    user = UserFactory()
    api = APIClient(REMOTE_ADDR="192.0.2.7")
    bad = {"username": user.username, "password": "wrong"}
    assert api.post("/api/v1/auth/login/", bad, format="json").status_code == 400
    good = {"username": user.username, "password": PASSWORD}
    assert api.post("/api/v1/auth/login/", good, format="json").status_code == 200

    failed, succeeded = AuditEvent.objects.filter(action="auth.login").order_by("id")
    assert (failed.outcome, failed.actor, failed.object_repr) == ("denied", None, user.username)
    assert (succeeded.outcome, succeeded.actor) == ("success", user)
    assert {failed.source, succeeded.source} == {"api"}
    assert {failed.ip_address, succeeded.ip_address} == {"192.0.2.7"}


def test_portal_login_and_logout_are_audited(client):
    user = UserFactory()
    response = client.post("/login/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302
    client.post("/logout/")
    events = list(AuditEvent.objects.filter(actor=user).values_list("action", "source"))
    assert events == [("auth.logout", "portal"), ("auth.login", "portal")]
