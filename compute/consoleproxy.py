"""The console proxy: browsers' and CLIs' websockets to guests' serial consoles.

It is websockify (noVNC's proxy, the one Nova's serial and VNC proxies are built on) with
a request handler of Kumo's own, run by ``manage.py console-proxy``:

1. before the websocket upgrade, a browser's ``Origin`` must name one of the portal's
   host names (``ALLOWED_HOSTS``) or ``KUMO_CONSOLE_ALLOWED_ORIGINS``; otherwise 403, so
   another site's page cannot open a console with a token it stole (a client sending no
   Origin, the CLI or a script, is let through: the token is what authenticates);
2. after it, the token in the URL's query is redeemed (``console_token_redeem``: once,
   in time, for the VM the URL's path names, with the user's membership and the VM's
   state checked again); a refusal closes the websocket with code 1008 and the reason;
3. the guest's console is opened through its host's libvirt
   (``compute.drivers.serialconsole``) and bytes are relayed both ways, in binary frames,
   until either side closes.

The server is websockify's threaded one (``LibProxyServer``): one thread per session; its
database connection is closed as soon as the token is redeemed.
"""

from __future__ import annotations

import logging
import re
from http.cookies import CookieError, SimpleCookie
from importlib import import_module
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.db import connections
from django.http.request import validate_host
from websockify.websocket import WebSocketWantReadError, WebSocketWantWriteError
from websockify.websocketproxy import LibProxyServer, ProxyRequestHandler

from compute.drivers.base import DriverError
from compute.drivers.serialconsole import open_console
from compute.services.consoles import ConsoleRefused, console_token_redeem
from controlplane import audit

log = logging.getLogger(__name__)

PATH = re.compile(r"/vms/(?P<vm>[^/?]+)/?$")
POLICY_VIOLATION, INTERNAL_ERROR = 1008, 1011
# How long a refused client has to answer our close frame before the connection goes.
CLOSE_WAIT_S = 2.0


def origin_allowed(origin: str | None) -> bool:
    """Whether a websocket from a page of ``origin`` may connect (None: not a browser)."""
    if origin is None:
        return True
    host = urlsplit(origin).hostname
    if not host:
        return False  # "null" (a sandboxed frame, a file://) and anything unreadable
    allowed = [*settings.ALLOWED_HOSTS, *settings.CONSOLE_ALLOWED_ORIGINS]
    return validate_host(host, allowed) or validate_host(f"[{host}]", allowed)


def session_user_id(cookie_header: str | None) -> int | None:
    """The user of the portal session whose cookie came with the websocket, if any (a
    browser on the portal's site sends it: cookies are per host name, not per port)."""
    if not cookie_header:
        return None
    try:
        morsel = SimpleCookie(cookie_header).get(settings.SESSION_COOKIE_NAME)
    except CookieError:
        return None
    if morsel is None or not morsel.value:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(morsel.value)
    try:
        return int(store.get("_auth_user_id"))
    except (TypeError, ValueError):
        return None


def _reason(text: str) -> str:
    # A close frame's reason is at most 123 bytes.
    return text.encode()[:123].decode(errors="ignore")


class ConsoleProxyHandler(ProxyRequestHandler):
    """One websocket: check its origin, redeem its token, relay its guest's console."""

    def handle_upgrade(self):
        origin = self.headers.get("Origin")
        if not origin_allowed(origin):
            log.warning("console proxy: refused origin %r from %s", origin, self.client_address[0])
            self.send_error(403, "origin not allowed")
            return
        super().handle_upgrade()

    def send_close(self, code=1000, reason=""):
        """Our close frame, then the client's before the connection goes (RFC 6455's closing
        handshake; websockify leaves the wait to its caller). Closed at once, the socket
        would answer the client's close frame with a TCP reset, which can discard ours
        unread: the client would see 1006 instead of the reason."""
        super().send_close(code, reason)
        try:
            self.request.settimeout(CLOSE_WAIT_S)
            while self.request.recvmsg() is not None:
                pass
        except (OSError, WebSocketWantReadError, WebSocketWantWriteError):
            pass  # gone, or silent past the wait: the connection closes anyway

    def new_websocket_client(self):
        url = urlsplit(self.path)
        token = (parse_qs(url.query).get("token") or [""])[0]
        match = PATH.search(url.path)
        try:
            if match is None:
                raise ConsoleRefused("path: not /vms/<vm id>/")
            with audit.audit_context(ip_address=self.client_address[0]):
                target = console_token_redeem(
                    token,
                    vm_id=match["vm"],
                    session_user_id=session_user_id(self.headers.get("Cookie")),
                )
        except ConsoleRefused as refused:
            log.info("console proxy: refused %s: %s", self.client_address[0], refused.message)
            raise self.CClose(POLICY_VIOLATION, _reason(refused.message)) from None
        finally:
            # This thread's database connection: not held for a session that may last hours.
            connections.close_all()
        log.info(
            "console proxy: vm %s on %s for user %s (token %s)",
            target.vm_id, target.host, target.user_id, target.token_id,
        )  # fmt: skip
        try:
            guest = open_console(target.libvirt_uri, target.vm_id)
        except DriverError as exc:
            log.warning("console proxy: vm %s: %s", target.vm_id, exc)
            raise self.CClose(INTERNAL_ERROR, _reason(f"console unavailable: {exc}")) from None
        try:
            self.do_proxy(guest)
        finally:
            guest.close()
            log.info("console proxy: vm %s session ended", target.vm_id)


class ConsoleProxyServer(LibProxyServer):
    """The proxy's listening socket; ``serve_forever()`` runs it, ``shutdown()`` stops it.
    Sessions run in daemon threads: stopping the server ends them with the process."""

    daemon_threads = True

    def __init__(self, host: str, port: int, *, heartbeat_s: int = 30):
        super().__init__(
            RequestHandlerClass=ConsoleProxyHandler,
            listen_host=host,
            listen_port=port,
            heartbeat=heartbeat_s,
        )


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:6083`` for IPv6) as a pair."""
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{bind!r}: expected host:port")
    return host.strip("[]"), int(port)
