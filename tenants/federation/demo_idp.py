"""A real SAML 2.0 identity provider for ``make run`` and the tests (pysaml2's ``Server``).

It is a small WSGI application with its own key pair, and it also plays the *federation*:
it publishes a metadata aggregate (``/federation-metadata.xml``) that lists it among other
demo institutions, signed with a federation key whose certificate is ``/federation.crt``.
Kumo loads that aggregate exactly as it loads GakuNin's or eduGAIN's.

A login shows a page where you pick a demo person; the IdP then posts a signed response to
the SP's assertion consumer service. The SP's metadata is fetched from ``sp_metadata_url``
when an SP the IdP does not know asks.

For the tests, ``mode`` makes the next responses wrong on purpose: ``bad-signature`` (signed
with a key the federation does not list), ``wrong-audience`` (for another SP) or ``expired``
(validity ended ten minutes ago). It imports nothing from Django.

Run it alone: ``python -m tenants.federation.demo_idp --port 8700 --workdir var/demo-idp
--sp-metadata-url http://127.0.0.1:8000/saml2/metadata/``.
"""

import argparse
import html
import logging
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from unittest import mock
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
from saml2 import BINDING_HTTP_POST, BINDING_HTTP_REDIRECT, time_util
from saml2.authn_context import PASSWORD, AuthnBroker, authn_context_class_ref
from saml2.config import IdPConfig
from saml2.metadata import entities_descriptor, entity_descriptor
from saml2.saml import NAME_FORMAT_URI, NAMEID_FORMAT_PERSISTENT, NAMEID_FORMAT_TRANSIENT
from saml2.server import Server
from saml2.sigver import security_context
from saml2.xmldsig import DIGEST_SHA256, SIG_RSA_SHA256

from tenants.federation.keys import ensure_keypair

log = logging.getLogger(__name__)

XMLSEC = "/usr/bin/xmlsec1"
ATTRIBUTE_MAPS = str(Path(__file__).with_name("attributemaps"))

#: The people of the demo institution, with the attributes a GakuNin IdP releases.
DEMO_USERS = {
    "alice": {
        "eduPersonPrincipalName": ["alice@demo-university.example"],
        "mail": ["alice@demo-university.example"],
        "displayName": ["Alice Aoki"],
        "jaDisplayName": ["青木 アリス"],
        "o": ["Demo University"],
        "eduPersonAffiliation": ["faculty", "member"],
    },
    "bob": {
        "eduPersonPrincipalName": ["bob@demo-university.example"],
        "mail": ["bob@demo-university.example"],
        "displayName": ["Bob Baba"],
        "jaDisplayName": ["馬場 ボブ"],
        "o": ["Demo University"],
        "eduPersonAffiliation": ["student", "member"],
    },
}

#: Other institutions the aggregate lists, so the discovery page has something to search.
OTHER_IDPS = [
    ("https://idp.hokkaido-demo.example/idp/shibboleth", "Hokkaido Demo University"),
    ("https://idp.kyushu-demo.example/idp/shibboleth", "Kyushu Demo University"),
    ("https://idp.osaka-demo.example/idp/shibboleth", "Osaka Demo Institute of Technology"),
    ("https://idp.tohoku-demo.example/idp/shibboleth", "Tohoku Demo University"),
]

MODES = ("ok", "bad-signature", "wrong-audience", "expired")
OTHER_SP = "https://another-sp.example/shibboleth"


def _idp_config(
    entityid: str,
    base_url: str,
    key: Path,
    cert: Path,
    name: str,
    sp_metadata: list[str],
    lifetime_minutes: int = 15,
):
    conf = IdPConfig()
    conf.load(
        {
            "entityid": entityid,
            "xmlsec_binary": XMLSEC,
            "attribute_map_dir": ATTRIBUTE_MAPS,
            "key_file": str(key),
            "cert_file": str(cert),
            "metadata": {"inline": sp_metadata} if sp_metadata else {},
            "organization": {
                "name": [(name, "en")],
                "display_name": [(name, "en")],
                "url": [(base_url, "en")],
            },
            "service": {
                "idp": {
                    "name": name,
                    "endpoints": {
                        "single_sign_on_service": [
                            (f"{base_url}/sso/redirect", BINDING_HTTP_REDIRECT),
                            (f"{base_url}/sso/post", BINDING_HTTP_POST),
                        ]
                    },
                    "name_id_format": [NAMEID_FORMAT_PERSISTENT, NAMEID_FORMAT_TRANSIENT],
                    "want_authn_requests_signed": False,
                    "sign_response": True,
                    "sign_assertion": True,
                    "policy": {
                        "default": {
                            "lifetime": {"minutes": lifetime_minutes},
                            "attribute_restrictions": None,
                            "name_form": NAME_FORMAT_URI,
                        }
                    },
                }
            },
        }
    )
    return conf


class DemoIdP:
    """One demo IdP and its federation, keys kept under ``workdir``."""

    def __init__(self, *, base_url: str, workdir: Path, sp_metadata_url: str = ""):
        self.base_url = base_url.rstrip("/")
        self.entityid = f"{self.base_url}/metadata"
        self.workdir = Path(workdir)
        self.sp_metadata_url = sp_metadata_url
        self.key, self.cert = ensure_keypair(self.workdir, "idp", "Demo University IdP")
        self.rogue_key, self.rogue_cert = ensure_keypair(self.workdir, "rogue", "Rogue IdP")
        self.federation_key, self.federation_cert = ensure_keypair(
            self.workdir, "federation", "Demo federation metadata signer"
        )
        self.mode = "ok"
        #: the key the published aggregate is signed with (None: the federation's)
        self.aggregate_sign_key: Path | None = None
        self.name = "Demo University"
        self._sp_metadata: list[str] = []
        self._lock = threading.RLock()

    # --- metadata ---------------------------------------------------------------------------

    def _config(self, key=None, cert=None, lifetime_minutes=15):
        return _idp_config(
            self.entityid,
            self.base_url,
            key or self.key,
            cert or self.cert,
            self.name,
            self._sp_metadata,
            lifetime_minutes,
        )

    def aggregate_xml(self, *, sign_key: Path | None = None, valid_hours: int = 48) -> str:
        """The federation's signed metadata aggregate: this IdP and the other institutions."""
        eds = [entity_descriptor(self._config())]
        for entityid, name in OTHER_IDPS:
            base = entityid.rsplit("/idp/", 1)[0]
            eds.append(
                entity_descriptor(_idp_config(entityid, base, self.key, self.cert, name, []))
            )
        signer = self._config(key=sign_key or self.federation_key, cert=self.federation_cert)
        _, xml = entities_descriptor(
            eds,
            valid_hours,
            "urn:mace:kumo:demo-federation",
            "demo-federation",
            True,
            security_context(signer),
            sign_alg=SIG_RSA_SHA256,
            digest_alg=DIGEST_SHA256,
        )
        return xml

    def write_federation(self) -> tuple[Path, Path]:
        """Write the aggregate and the federation certificate into ``workdir``."""
        path = self.workdir / "federation-metadata.xml"
        path.write_text(self.aggregate_xml())
        return path, self.federation_cert

    # --- login ------------------------------------------------------------------------------

    def _learn_sp(self, sp_entity: str) -> None:
        """Fetch the SP's metadata the first time it asks (and list a second SP, another
        entity at the same address, for ``wrong-audience``)."""
        with self._lock:
            if self.sp_metadata_url and not any(sp_entity in doc for doc in self._sp_metadata):
                sp = httpx.get(self.sp_metadata_url, timeout=10).text
                self._sp_metadata = [
                    sp,
                    sp.replace(f'entityID="{sp_entity}"', f'entityID="{OTHER_SP}"'),
                ]

    def respond(self, saml_request: str, binding: str, relay_state: str, username: str) -> str:
        """The auto-posting page that carries the signed response for ``username``."""
        req = Server(config=self._config()).parse_authn_request(saml_request, binding)
        self._learn_sp(req.message.issuer.text)
        mode = self.mode
        config = self._config()
        if mode == "bad-signature":
            config = self._config(key=self.rogue_key, cert=self.rogue_cert)
        server = Server(config=config)
        req = server.parse_authn_request(saml_request, binding)
        args = server.response_args(req.message, [BINDING_HTTP_POST])
        if mode == "wrong-audience":
            args["sp_entity_id"] = OTHER_SP
        with self._lock, self._clock(-3600 if mode == "expired" else 0):
            return self._respond(server, args, relay_state, username)

    @staticmethod
    @contextmanager
    def _clock(offset_s: int):
        """Issue assertions as if the clock were ``offset_s`` off (an expired one: -3600)."""
        if not offset_s:
            yield
            return
        with mock.patch.multiple(
            "saml2.assertion",
            instant=lambda **kw: time_util.instant(time_stamp=time.time() + offset_s),
            in_a_while=lambda **kw: time_util.time_in_a_while(
                seconds=offset_s + timedelta(**kw).total_seconds()
            ).strftime(time_util.TIME_FORMAT),
        ):
            yield

    def _respond(self, server, args, relay_state, username) -> str:
        broker = AuthnBroker()
        broker.add(authn_context_class_ref(PASSWORD), "")
        identity = DEMO_USERS[username]
        response = server.create_authn_response(
            identity,
            userid=identity["eduPersonPrincipalName"][0],
            authn=broker.get_authn_by_accr(PASSWORD),
            sign_response=True,
            sign_assertion=True,
            sign_alg=SIG_RSA_SHA256,
            digest_alg=DIGEST_SHA256,
            **args,
        )
        http = server.apply_binding(
            BINDING_HTTP_POST, str(response), args["destination"], relay_state, response=True
        )
        return http["data"]

    # --- WSGI ---------------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "POST":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            form = parse_qs(environ["wsgi.input"].read(size).decode())
        else:
            form = parse_qs(environ.get("QUERY_STRING", ""))
        field = {k: v[0] for k, v in form.items()}
        try:
            if path == "/metadata":
                return self._reply(start_response, str(entity_descriptor(self._config())), "xml")
            if path == "/federation-metadata.xml":
                xml = self.aggregate_xml(sign_key=self.aggregate_sign_key)
                return self._reply(start_response, xml, "xml")
            if path == "/federation.crt":
                return self._reply(start_response, self.federation_cert.read_text(), "plain")
            if path in ("/sso/redirect", "/sso/post"):
                binding = BINDING_HTTP_REDIRECT if path.endswith("redirect") else BINDING_HTTP_POST
                return self._reply(start_response, self._login_page(field, binding), "html")
            if path == "/sso/login" and method == "POST":
                if field.get("username") not in DEMO_USERS:
                    return self._reply(start_response, "unknown user", "plain", "400 Bad Request")
                page = self.respond(
                    field["SAMLRequest"],
                    field["binding"],
                    field.get("RelayState", ""),
                    field["username"],
                )
                return self._reply(start_response, page, "html")
        except Exception as e:  # a demo: say what went wrong on the page
            log.exception("demo IdP: %s failed", path)
            return self._reply(start_response, f"error: {e}", "plain", "400 Bad Request")
        return self._reply(start_response, "not found", "plain", "404 Not Found")

    @staticmethod
    def _reply(start_response, body: str, kind: str, status: str = "200 OK"):
        ctype = {"xml": "application/samlmetadata+xml", "html": "text/html", "plain": "text/plain"}
        start_response(status, [("Content-Type", f"{ctype[kind]}; charset=utf-8")])
        return [body.encode()]

    def _login_page(self, field: dict, binding: str) -> str:
        e = html.escape
        options = "".join(
            f'<option value="{e(u)}">{e(a["displayName"][0])} ({e(u)})</option>'
            for u, a in DEMO_USERS.items()
        )
        return f"""<!doctype html><html><head><meta charset="utf-8">
<title>Demo University · sign in</title></head>
<body style="font-family: sans-serif; max-width: 28rem; margin: 3rem auto">
<h1>Demo University</h1>
<p>This is Kumo's demo identity provider. Pick who you are; no password is asked.</p>
<form method="post" action="{e(self.base_url)}/sso/login">
<input type="hidden" name="SAMLRequest" value="{e(field.get("SAMLRequest", ""))}">
<input type="hidden" name="RelayState" value="{e(field.get("RelayState", ""))}">
<input type="hidden" name="binding" value="{e(binding)}">
<label for="username">Person</label> <select id="username" name="username">{options}</select>
<p><button type="submit">Sign in</button></p>
</form></body></html>"""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        log.debug("demo IdP: " + format, *args)


class _ThreadingServer(WSGIServer):
    daemon_threads = True

    def process_request(self, request, client_address):
        threading.Thread(target=self._handle, args=(request, client_address), daemon=True).start()

    def _handle(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        finally:
            self.shutdown_request(request)


def serve(idp: DemoIdP, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``idp`` on ``host:port`` in a thread; ``server.shutdown()`` stops it."""
    server = make_server(
        host, port, idp, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="demo-idp")
    thread.start()
    return server, thread


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--sp-metadata-url", default="http://127.0.0.1:8000/saml2/metadata/")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    idp = DemoIdP(
        base_url=f"http://{args.host}:{args.port}",
        workdir=args.workdir,
        sp_metadata_url=args.sp_metadata_url,
    )
    idp.write_federation()
    server = make_server(
        args.host, args.port, idp, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    log.info("demo IdP %s on http://%s:%s", idp.entityid, args.host, args.port)
    server.serve_forever()


if __name__ == "__main__":
    main()

__all__ = ["DEMO_USERS", "MODES", "OTHER_IDPS", "DemoIdP", "serve"]
