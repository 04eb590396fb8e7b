"""``make run``'s demo IdP: the run command writes the demo federation's signed aggregate,
loads it, and points the web process at it; the demo IdP is one more process."""

import pytest

from controlplane.management.commands.run import demo_federation
from tenants.federation.models import FederationMetadata

pytestmark = pytest.mark.django_db


def test_run_sets_up_the_demo_federation(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    settings.SAML_METADATA_URL = ""
    monkeypatch.delenv("KUMO_DEMO_IDP", raising=False)
    env = {}
    demo = demo_federation(env, "http://127.0.0.1:8000")
    assert env["KUMO_SAML_METADATA_URL"].endswith("federation-metadata.xml")
    assert env["KUMO_BASE_URL"] == "http://127.0.0.1:8000"
    row = FederationMetadata.objects.get(source=env["KUMO_SAML_METADATA_URL"])
    assert row.last_error == "" and row.idp_count == 5
    assert demo["argv"][1:3] == ["-m", "tenants.federation.demo_idp"]
    assert "--sp-metadata-url" in demo["argv"]


def test_a_configured_federation_gets_no_demo(settings):
    settings.SAML_METADATA_URL = "https://metadata.example/federation.xml"
    assert demo_federation({}, "http://127.0.0.1:8000")["argv"] is None
