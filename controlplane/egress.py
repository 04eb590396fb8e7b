"""Requests the controller sends to addresses a tenant chose (webhooks), without letting a
tenant aim them at the controller's own side of the network (server-side request forgery).

A destination is allowed only when every address its host name stands for is a public
(globally routable) unicast address, or lies in a range the operator listed in
``KUMO_WEBHOOK_ALLOWED_NETWORKS``. Refused: loopback, link-local (169.254.0.0/16 holds the
cloud metadata service), private (RFC 1918, 100.64.0.0/10), unique-local (fc00::/7),
multicast, unspecified and reserved addresses, in every spelling a resolver accepts:
``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``0``, a trailing dot,
``[::ffff:127.0.0.1]``, and IPv6 forms that embed an IPv4 address (IPv4-mapped, 6to4,
Teredo) are judged by the address they embed.

``check`` is run when a webhook is saved and ``post`` at every delivery. ``post`` resolves the
name once, checks every address, and connects to an address it checked while sending the
URL's own ``Host`` header and TLS server name (and checking the certificate against that
name), so an answer that changes between the check and the connection (DNS rebinding)
never reaches a refused address. Redirects are not followed and proxies from the
environment are not used (a proxy would resolve the name again).
"""

import ipaddress
import socket
import urllib.parse
from dataclasses import dataclass

import httpx
from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """The destination is not one the controller may send to; ``reason`` says why in a
    sentence fit for the tenant who chose it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Destination:
    scheme: str
    host: str  # as written in the URL (no brackets), used for Host and TLS
    port: int
    addresses: tuple[Address, ...]  # every address the host stands for, all checked


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` stands for, as the system resolver answers (numeric spellings
    such as ``2130706433`` are answered without DNS). Tests replace this to inject a
    resolver that changes its answer."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


def _literal(host: str) -> Address | None:
    """``host`` as an IP address if it is one in any spelling (``inet_aton`` forms too)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, UnicodeError, ValueError):
        return None


def _embedded(address: Address) -> Address | None:
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address.teredo is not None:
            return address.teredo[1]
    return None


def _allowed_networks():
    return [
        ipaddress.ip_network(n.strip(), strict=False)
        for n in settings.WEBHOOK_ALLOWED_NETWORKS
        if n.strip()
    ]


def refusal(address: Address) -> str | None:
    """Why ``address`` may not be sent to, or None when it may."""
    allowed = _allowed_networks()
    candidates = [address]
    if (inner := _embedded(address)) is not None:
        candidates.append(inner)
    for candidate in candidates:
        if any(candidate.version == n.version and candidate in n for n in allowed):
            return None
    for candidate in reversed(candidates):  # the embedded address is the one reached
        if candidate.is_unspecified:
            kind = "an unspecified"
        elif candidate.is_loopback:
            kind = "a loopback"
        elif candidate.is_link_local:
            kind = "a link-local"
        elif candidate.is_multicast:
            kind = "a multicast"
        elif isinstance(candidate, ipaddress.IPv6Address) and candidate in _UNIQUE_LOCAL:
            kind = "a unique-local"
        elif candidate.is_reserved:
            kind = "a reserved"
        elif candidate.is_private or not candidate.is_global:
            kind = "a private"
        else:
            continue
        return f"{candidate} is {kind} address; webhooks may only reach public addresses"
    return None


_UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")


def check(url: str) -> Destination:
    """The destination of ``url`` with every address checked; raises ``Refused``.

    A name that does not resolve is refused here; ``check_saved`` lets it pass at save time.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise Refused("only http and https URLs are allowed")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise Refused(f"the URL's port is invalid ({e})") from None
    if not host:
        raise Refused("the URL has no host")
    port = port or (443 if scheme == "https" else 80)
    name = host.rstrip(".") or host
    literal = _literal(name)
    if literal is not None:
        found = [literal]
    else:
        try:
            found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolve(name, port)]
        except (OSError, UnicodeError) as e:
            raise Unresolved(f"{host} does not resolve ({e})") from None
        if not found:
            raise Unresolved(f"{host} does not resolve")
    for address in found:
        if (reason := refusal(address)) is not None:
            raise Refused(reason if address == literal else f"{host} resolves to {reason}")
    return Destination(scheme=scheme, host=host, port=port, addresses=tuple(dict.fromkeys(found)))


class Unresolved(Refused):
    """The name did not resolve (now): refused at delivery, let through when saved."""


def check_saved(url: str) -> None:
    """The check a webhook's URL passes when it is saved: every address it names now is
    allowed. A name that does not resolve at this moment is accepted (DNS may be briefly
    unreachable); every delivery checks again."""
    try:
        check(url)
    except Unresolved:
        return


def post(
    url: str, *, content: bytes, headers: dict, timeout: float = 10, verify=True
) -> httpx.Response:
    """POST ``content`` to ``url``, connecting only to addresses ``check`` allowed: the
    first of them that accepts the connection. Raises ``Refused`` (nothing was sent) or
    ``httpx.HTTPError``. ``verify``: httpx's TLS verification (the system's CAs; an
    ``ssl.SSLContext`` to trust others), always against the URL's host name."""
    destination = check(url)
    parts = urllib.parse.urlsplit(url)
    default_port = 443 if destination.scheme == "https" else 80
    host_header = destination.host if ":" not in destination.host else f"[{destination.host}]"
    if destination.port != default_port:
        host_header += f":{destination.port}"
    error: httpx.HTTPError | None = None
    with httpx.Client(
        trust_env=False, follow_redirects=False, timeout=timeout, verify=verify
    ) as client:
        for address in destination.addresses:
            netloc = str(address) if address.version == 4 else f"[{address}]"
            pinned = parts._replace(netloc=f"{netloc}:{destination.port}", fragment="")
            request = client.build_request(
                "POST",
                urllib.parse.urlunsplit(pinned),
                content=content,
                headers={**headers, "Host": host_header},
                extensions={"sni_hostname": destination.host},
            )
            try:
                return client.send(request)
            except httpx.ConnectError as e:
                error = e
    raise error or httpx.ConnectError(f"no address of {destination.host} accepted")
