"""SAML login against a real IdP on loopback, with an HTTP client: just-in-time creation,
the same user on the next login, refusals (bad signature, wrong audience, expired,
replayed) audited and explained; the metadata aggregate's own signature; SP metadata."""

import httpx
import pytest
from django.core import mail

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from tenants.federation import demo_idp
from tenants.federation.metadata import metadata_refresh
from tenants.federation.models import FederationMetadata
from tenants.models import ExternalIdentity, User
from tests.factories import UserFactory
from tests.tenants.federation.conftest import saml_login

pytestmark = pytest.mark.django_db(transaction=True)


def test_first_login_creates_the_user_and_the_next_finds_the_same(kumo_site, idp):
    with httpx.Client() as client:
        done = saml_login(client, kumo_site, idp, "alice")
        assert done.status_code == 302 and done.headers["location"] == "/"
        me = client.get(f"{kumo_site}/api/v1/user/").json()
    identity = ExternalIdentity.objects.get()
    assert identity.issuer == idp.entityid
    assert identity.subject == "alice@demo-university.example"
    user = identity.user
    assert me["username"] == user.username
    assert user.email == "alice@demo-university.example"
    assert user.display_name == "Alice Aoki"
    assert user.organisation == "Demo University"
    assert user.affiliation == "faculty,member"
    assert identity.attributes["jaDisplayName"] == ["青木 アリス"]
    assert not user.has_usable_password()
    assert AuditEvent.objects.filter(action="user.create", object_id=str(user.pk)).exists()

    with httpx.Client() as client:  # a new browser: a second login
        assert saml_login(client, kumo_site, idp, "alice").status_code == 302
        assert client.get(f"{kumo_site}/api/v1/user/").json()["username"] == user.username
    assert User.objects.count() == 1 and ExternalIdentity.objects.count() == 1
    assert AuditEvent.objects.filter(action="user.federated_login").count() == 2


def test_a_login_never_matches_by_email(kumo_site, idp):
    local = UserFactory(email="alice@demo-university.example")
    with httpx.Client() as client:
        assert saml_login(client, kumo_site, idp, "alice").status_code == 302
    identity = ExternalIdentity.objects.get()
    assert identity.user != local
    assert User.objects.filter(email="alice@demo-university.example").count() == 2


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("bad-signature", "signature does not verify"),
        ("wrong-audience", "issued for another service"),
        ("expired", "outside its validity period"),
    ],
)
def test_a_bad_assertion_is_refused_with_a_page_and_audited(kumo_site, idp, mode, reason):
    idp.mode = mode
    with httpx.Client() as client:
        refused = saml_login(client, kumo_site, idp, "alice")
        assert refused.status_code == 403
        assert reason in refused.text and "Login refused" in refused.text
        assert client.get(f"{kumo_site}/api/v1/user/").status_code in (401, 403)
    assert not ExternalIdentity.objects.exists() and not User.objects.exists()
    event = AuditEvent.objects.get(action="user.federated_login")
    assert event.outcome == AuditOutcome.DENIED
    assert reason in event.detail["reason"]
    assert event.detail["issuer"] == idp.entityid


def test_a_replayed_assertion_is_refused(kumo_site, idp):
    posted = {}
    with httpx.Client() as client:
        assert saml_login(client, kumo_site, idp, "bob", keep=posted).status_code == 302
    acs = posted.pop("acs")
    # The same response again, from the same browser and from a fresh one.
    with httpx.Client() as client:
        again = client.post(acs, data=posted)
        assert again.status_code == 403 and "replayed" in again.text
    refusals = AuditEvent.objects.filter(action="user.federated_login", outcome=AuditOutcome.DENIED)
    assert refusals.count() == 1
    assert "replayed" in refusals.get().detail["reason"]


def test_a_replay_within_the_same_session_hits_the_assertion_store(kumo_site, idp):
    posted = {}
    with httpx.Client() as client:
        assert saml_login(client, kumo_site, idp, "bob", keep=posted).status_code == 302
        acs = posted.pop("acs")
        # start a new login so the session again expects a response, then replay the old one
        client.post(f"{kumo_site}/logout/")
        client.get(f"{kumo_site}/saml2/login/", params={"idp": idp.entityid})
        again = client.post(acs, data=posted)
        assert again.status_code == 403 and "replayed" in again.text


def test_discovery_lists_the_federation_searches_and_remembers(kumo_site, idp):
    with httpx.Client() as client:
        page = client.get(f"{kumo_site}/login/institution/")
        assert page.status_code == 200
        for _entity, name in demo_idp.OTHER_IDPS:
            assert name in page.text
        assert "Demo University" in page.text
        found = client.get(f"{kumo_site}/login/institution/", params={"q": "kyushu"})
        assert "Kyushu Demo University" in found.text
        assert "Tohoku Demo University" not in found.text
        assert "Last time you used" not in page.text
        # no idp chosen: the login view sends you to discovery
        start = client.get(f"{kumo_site}/saml2/login/")
        assert start.status_code == 302 and "/login/institution/" in start.headers["location"]
        assert saml_login(client, kumo_site, idp, "alice").status_code == 302
        again = client.get(f"{kumo_site}/login/institution/")
        assert "Continue with Demo University" in again.text


def test_sp_metadata_is_published(kumo_site, idp):
    response = httpx.get(f"{kumo_site}/saml2/metadata/")
    assert response.status_code == 200
    assert f'entityID="{kumo_site}/saml2/metadata/"' in response.text
    assert f'Location="{kumo_site}/saml2/acs/"' in response.text
    assert "X509Certificate" in response.text


def test_an_aggregate_with_a_bad_signature_keeps_the_last_good_copy(kumo_site, idp, settings):
    UserFactory(is_staff=True, email="ops@example.org")
    good = FederationMetadata.objects.get()
    idp.aggregate_sign_key = idp.rogue_key
    mail.outbox.clear()
    row = metadata_refresh()
    assert row.sha256 == good.sha256 and row.document == good.document
    assert "signature does not verify" in row.last_error
    event = AuditEvent.objects.filter(action="federation.metadata_refresh").latest("id")
    assert event.outcome == AuditOutcome.FAILED
    assert [m.to for m in mail.outbox] == [["ops@example.org"]]
    # logins go on with the last good copy
    with httpx.Client() as client:
        assert saml_login(client, kumo_site, idp, "alice").status_code == 302
    # and the next good copy clears the error
    idp.aggregate_sign_key = None
    assert metadata_refresh().last_error == ""
