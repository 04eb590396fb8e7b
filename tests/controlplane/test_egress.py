"""Webhooks cannot be aimed at the controller's side of the network (SSRF): refused when
saved (400 naming ``url``) and when delivered, in every spelling of an address, through DNS
rebinding too, unless ``KUMO_WEBHOOK_ALLOWED_NETWORKS`` lists the range. A listener on
loopback stands for what an attacker wants to reach: it must receive nothing."""

import http.server
import socket
import threading

import httpx
import pytest
from django.urls import reverse

from controlplane import egress, events, services
from controlplane.models import Webhook
from controlplane.tasks import webhook_deliver

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"  # a public address (never connected to: the tests pin loopback)


class Listener(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.received.append((self.path, dict(self.headers), data))
        if self.path == "/redirect":
            self.send_response(307)
            self.send_header("Location", "/elsewhere")
        else:
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def listener():
    """An HTTP server on 127.0.0.1 that records every request it gets."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def rebinding_dns(monkeypatch):
    """A resolver that answers a public address for ``rebind.test`` the first time (when the
    webhook is saved) and 127.0.0.1 every time after (at delivery): DNS rebinding. Other
    names go to the real resolver."""
    real = socket.getaddrinfo
    asked = []

    def getaddrinfo(host, port, *args, **kwargs):
        if str(host).rstrip(".") != "rebind.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = PUBLIC if len(asked) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 80)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def _hook(project, url):
    """A webhook row as an older Kumo (or a narrower operator setting) may have left it."""
    return Webhook.objects.create(project=project, url=url, secret="s" * 64)


def _deliver(hook, project):
    event = events.emit("vm.notice", project=project, message="m")
    return webhook_deliver(webhook_id=hook.pk, event_id=event.pk)


SPELLINGS = [
    "127.0.0.1",
    "127.1",
    "2130706433",
    "0x7f000001",
    "0177.0.0.1",
    "0",
    "0.0.0.0",
    "127.0.0.1.",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "localhost",
]


@pytest.mark.parametrize("host", SPELLINGS)
def test_no_spelling_of_loopback_receives_a_delivery(project, listener, host):
    hook = _hook(project, f"http://{host}:{listener.server_port}/hook")
    assert _deliver(hook, project) == 0
    assert listener.received == []
    assert Webhook.objects.get(pk=hook.pk).last_status.startswith("refused: ")


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8000/", "loopback"),
        ("http://[::1]:8080/x", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://[::]/", "unspecified"),
        ("http://10.1.2.3/", "private"),
        ("http://192.168.0.1/", "private"),
        ("http://100.64.0.1/", "private"),
        ("http://[fd00::1]/", "unique-local"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),
        ("http://[2002:7f00:1::]/", "loopback"),  # 6to4 around 127.0.0.1
        ("http://localhost:8000/", "loopback"),
    ],
)
def test_saving_a_webhook_to_a_non_public_address_is_refused(client_for, project, url, kind):
    api = client_for(project.owner)
    answer = api.post(
        reverse("api:project-webhook-list", kwargs={"project_slug": project.slug}),
        {"url": url},
        format="json",
    )
    assert answer.status_code == 400, answer.json()
    (reason,) = answer.json()["details"]["url"]
    assert f"is a {kind} address" in reason or f"is an {kind} address" in reason
    assert not Webhook.objects.for_project(project).exists()


def test_a_public_address_and_an_allowed_range_are_accepted(client_for, project, settings):
    api = client_for(project.owner)
    url = reverse("api:project-webhook-list", kwargs={"project_slug": project.slug})
    assert api.post(url, {"url": f"https://{PUBLIC}/h"}, format="json").status_code == 201
    assert api.post(url, {"url": "ftp://example.org/h"}, format="json").status_code == 400
    settings.WEBHOOK_ALLOWED_NETWORKS = ("10.20.0.0/16",)
    assert api.post(url, {"url": "http://10.20.1.2/h"}, format="json").status_code == 201
    assert api.post(url, {"url": "http://10.21.1.2/h"}, format="json").status_code == 400


def test_other_spellings_are_judged_by_the_address_they_name():
    for host in ("2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0", "127.0.0.1."):
        with pytest.raises(egress.Refused):
            egress.check(f"http://{host}/")
    assert egress.check(f"http://{PUBLIC}./").addresses[0].exploded == PUBLIC


def test_dns_rebinding_cannot_reach_loopback(project, listener, rebinding_dns):
    url = f"http://rebind.test:{listener.server_port}/hook"
    hook, _ = services.webhook_create(project=project, url=url)  # resolves to PUBLIC now
    assert _deliver(hook, project) == 0  # resolves to 127.0.0.1 now: refused
    assert listener.received == []
    assert (
        "resolves to 127.0.0.1 is a loopback address" in Webhook.objects.get(pk=hook.pk).last_status
    )
    assert len(rebinding_dns) == 2  # once when saved, once when delivered; never by httpx


def test_an_allowed_range_receives_at_the_checked_address_with_the_name_as_host(
    project, listener, rebinding_dns, settings
):
    url = f"http://rebind.test:{listener.server_port}/hook"
    hook, _ = services.webhook_create(project=project, url=url)
    settings.WEBHOOK_ALLOWED_NETWORKS = ("127.0.0.0/8",)
    assert _deliver(hook, project) == 204
    ((path, headers, body),) = listener.received
    assert path == "/hook" and headers["Host"] == f"rebind.test:{listener.server_port}"
    assert b"vm.notice" in body
    assert len(rebinding_dns) == 2  # the delivery connected to what it checked


def test_redirects_are_not_followed(project, listener, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ("127.0.0.0/8",)
    hook, _ = services.webhook_create(
        project=project, url=f"http://127.0.0.1:{listener.server_port}/redirect"
    )
    assert _deliver(hook, project) == 307
    assert [path for path, _, _ in listener.received] == ["/redirect"]


def _tls_listener(tmp_path, name):
    """An HTTPS server on 127.0.0.1 with a self-signed certificate for ``name``; returns
    it and a client context that trusts that certificate."""
    import ssl
    import subprocess

    key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name}"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    server.received = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, ssl.create_default_context(cafile=str(cert))


def test_tls_is_verified_against_the_name_while_connecting_to_the_checked_address(
    tmp_path, monkeypatch, settings
):
    settings.WEBHOOK_ALLOWED_NETWORKS = ("127.0.0.0/8",)
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in ("hook.test", "impostor.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", int(port)))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    server, trust = _tls_listener(tmp_path, "hook.test")
    try:
        port = server.server_port
        answer = egress.post(
            f"https://hook.test:{port}/hook", content=b"{}", headers={}, verify=trust
        )
        assert answer.status_code == 204  # SNI and the certificate check used the name
        ((_path, headers, _body),) = server.received
        assert headers["Host"] == f"hook.test:{port}"
        # The same address under another name: the certificate does not match it.
        with pytest.raises(httpx.ConnectError, match=r"certificate|hostname"):
            egress.post(
                f"https://impostor.test:{port}/hook", content=b"{}", headers={}, verify=trust
            )
        assert len(server.received) == 1
    finally:
        server.shutdown()
        server.server_close()
