"""Fixtures of the federated-login tests: Kumo served on loopback by a real WSGI server in
this process (so the test's settings apply), and a real SAML IdP (the demo IdP, pysaml2's
server) on another port, publishing a metadata aggregate signed by a test federation key."""

import html
import re

import httpx
import pytest
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.handlers.wsgi import WSGIHandler
from django.db import connections

from tenants.federation import demo_idp
from tenants.federation.keys import ensure_keypair
from tenants.federation.metadata import metadata_refresh
from tests.e2e.processes import free_port


class _ClosingApp:
    """Django's WSGI handler, closing the thread's database connections after each request
    (every request runs in a thread of its own), so the test database can be dropped."""

    def __init__(self):
        self.app = StaticFilesHandler(WSGIHandler())

    def __call__(self, environ, start_response):
        try:
            return list(self.app(environ, start_response))
        finally:
            connections.close_all()


@pytest.fixture(scope="session")
def idp_keys(tmp_path_factory):
    """Key pairs made once per run (RSA generation is the slow part)."""
    return tmp_path_factory.mktemp("demo-idp")


@pytest.fixture
def kumo_site(settings, idp_keys):
    """Kumo on http://127.0.0.1:<port> (same site as the IdP: cookies go with its POST)."""
    port = free_port()
    settings.KUMO_BASE_URL = f"http://127.0.0.1:{port}"
    key, cert = ensure_keypair(idp_keys, "sp", "Kumo test SP")
    settings.SAML_SP_KEY, settings.SAML_SP_CERT = str(key), str(cert)
    server, _ = demo_idp.serve(_ClosingApp(), "127.0.0.1", port)
    yield settings.KUMO_BASE_URL
    server.shutdown()
    server.server_close()


@pytest.fixture
def idp(kumo_site, idp_keys, settings):
    """The demo IdP on loopback, listed in a signed aggregate Kumo has loaded."""
    port = free_port()
    provider = demo_idp.DemoIdP(
        base_url=f"http://127.0.0.1:{port}",
        workdir=idp_keys,
        sp_metadata_url=f"{kumo_site}/saml2/metadata/",
    )
    server, _ = demo_idp.serve(provider, "127.0.0.1", port)
    settings.SAML_METADATA_URL = f"{provider.base_url}/federation-metadata.xml"
    settings.SAML_FEDERATION_CERT = str(provider.federation_cert)
    row = metadata_refresh()
    assert row.last_error == "" and row.idp_count == 1 + len(demo_idp.OTHER_IDPS)
    yield provider
    server.shutdown()
    server.server_close()


_INPUT = re.compile(r"<input[^>]*?name=\"([^\"]+)\"[^>]*?value=\"([^\"]*)\"", re.S)
_ACTION = re.compile(r"<form[^>]*?action=\"([^\"]+)\"", re.S)


def form_of(page: str) -> tuple[str, dict]:
    """(action, hidden fields) of the first form of an HTML page."""
    action = html.unescape(_ACTION.search(page).group(1))
    return action, {name: html.unescape(value) for name, value in _INPUT.findall(page)}


def saml_login(client: httpx.Client, kumo: str, idp, username="alice", *, keep=None):
    """Log in through the SP with an HTTP client: AuthnRequest, the IdP's page, the signed
    response posted to the ACS. Returns the ACS's answer; ``keep`` gets the posted form."""
    start = client.get(f"{kumo}/saml2/login/", params={"idp": idp.entityid, "next": "/"})
    assert start.status_code == 302, start.text
    page = client.get(start.headers["location"])
    assert page.status_code == 200, page.text
    action, fields = form_of(page.text)
    answer = client.post(action, data={**fields, "username": username})
    assert answer.status_code == 200, answer.text
    acs, posted = form_of(answer.text)
    if keep is not None:
        keep.update(posted, acs=acs)
    return client.post(acs, data=posted)
