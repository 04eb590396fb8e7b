"""OIDC login through a real provider on loopback (authorization code with PKCE): a first
login creates the user, the next finds the same; a wrong state or nonce is refused, with a
page and an audit event; two providers at once."""

import json

import httpx
import pytest

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from tenants.models import ExternalIdentity, User
from tests.e2e.processes import free_port
from tests.tenants.federation.oidc_provider import Provider

pytestmark = pytest.mark.django_db(transaction=True)

CLAIMS = {
    "sub": "u-4711",
    "email": "carol@lab.example.ac.jp",
    "email_verified": True,
    "name": "Carol Chiba",
    "organization": "Example Lab",
    "eduperson_scoped_affiliation": ["staff@lab.example.ac.jp"],
}


@pytest.fixture
def provider(kumo_site, settings):
    p = Provider(port=free_port(), client_id="kumo", client_secret="s3cret", claims=CLAIMS)
    p.start()
    other = Provider(port=free_port(), client_id="kumo2", client_secret="x", claims=CLAIMS)
    other.start()
    settings.OIDC_PROVIDERS = json.loads(
        json.dumps(
            [
                {
                    "name": "lab",
                    "label": "Lab SSO",
                    "issuer": p.issuer,
                    "client_id": "kumo",
                    "client_secret": "s3cret",
                },
                {
                    "name": "proxy",
                    "label": "Proxy",
                    "issuer": other.issuer,
                    "client_id": "kumo2",
                    "client_secret": "x",
                },
            ]
        )
    )
    yield p
    p.stop()
    other.stop()


def _login(client, kumo, name="lab"):
    start = client.get(f"{kumo}/oidc/{name}/login/", params={"next": "/"})
    assert start.status_code == 302, start.text
    at_provider = client.get(start.headers["location"])
    assert at_provider.status_code == 302, at_provider.text  # the provider consents at once
    return client.get(at_provider.headers["location"])


def test_oidc_login_with_pkce_creates_then_finds_the_user(kumo_site, provider):
    with httpx.Client() as client:
        page = client.get(f"{kumo_site}/login/")
        assert "Log in with Lab SSO" in page.text and "Log in with Proxy" in page.text
        done = _login(client, kumo_site)
        assert done.status_code == 302 and done.headers["location"] == "/"
        me = client.get(f"{kumo_site}/api/v1/user/").json()
    assert provider.seen_challenges  # the client sent a PKCE challenge
    identity = ExternalIdentity.objects.get()
    assert (identity.kind, identity.issuer, identity.subject) == ("oidc", provider.issuer, "u-4711")
    user = identity.user
    assert me["username"] == user.username
    assert (user.email, user.display_name, user.organisation) == (
        "carol@lab.example.ac.jp",
        "Carol Chiba",
        "Example Lab",
    )
    assert user.affiliation == "staff@lab.example.ac.jp"
    with httpx.Client() as client:
        assert _login(client, kumo_site).status_code == 302
        assert client.get(f"{kumo_site}/api/v1/user/").json()["username"] == user.username
    assert User.objects.count() == 1


@pytest.mark.parametrize(
    ("knob", "reason"), [("wrong_state", "wrong state"), ("wrong_nonce", "wrong nonce")]
)
def test_a_wrong_state_or_nonce_is_refused(kumo_site, provider, knob, reason):
    setattr(provider, knob, True)
    with httpx.Client() as client:
        refused = _login(client, kumo_site)
        assert refused.status_code == 403
        assert reason in refused.text
        assert client.get(f"{kumo_site}/api/v1/user/").status_code in (401, 403)
    assert not User.objects.exists()
    event = AuditEvent.objects.get(action="user.federated_login")
    assert event.outcome == AuditOutcome.DENIED and reason in event.detail["reason"]


def test_an_unknown_provider_is_404(kumo_site, provider):
    assert httpx.get(f"{kumo_site}/oidc/nope/login/").status_code == 404
