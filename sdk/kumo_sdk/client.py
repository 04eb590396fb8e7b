"""The Kumo client: one ``Client`` per server and credential.

Guarantees:

- **Authentication** by API token (``Authorization: Bearer kumo_…``); ``mint_token`` logs in
  with a username and password once to make one.
- **Retries**: a request that could not connect, whose connection broke, that timed out, or
  that was answered 502, 503 or 504 is sent again, up to ``retries`` more times with
  exponential backoff. Every POST carries an ``Idempotency-Key`` (generated unless given),
  the same on every try, so a POST whose answer was lost is replayed by the server, never
  done twice. A DELETE whose retry answers 404 counts as done: the lost try deleted it.
- **Errors** are exceptions from ``kumo_sdk.errors``, chosen by the error body's code and
  status; nothing returns an error as a value.
- **Pagination**: ``list`` methods iterate every page lazily, in the server's order. Objects
  created or deleted while iterating may shift page boundaries (page-number pagination).
- **Operations**: asynchronous work answers 202 with an operation; ``wait=True`` (or
  ``operations.wait``) polls it until it succeeds, raises ``OperationFailed`` when it fails
  and ``OperationTimeout`` when time runs out.

Project-owned resources take ``project=`` (a slug) or fall back to the client's ``project``.

Adding a resource, in three steps (``kumo_sdk.resource`` says more): a frozen dataclass in
``kumo_sdk.types``; a ``Resource`` subclass in ``kumo_sdk.resources.<area>`` naming its
``path``, ``type`` and ``verbs``; one line below (``shares = bind(Shares)``). A CLI command
group: a module ``kumo_sdk.cli.<group>`` with ``app = group("...")`` and ``@command(app,
"verb")`` functions, and one ``app.add_typer`` line in ``kumo_sdk.cli.app``.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx

from kumo_sdk import errors
from kumo_sdk.resource import bind, is_uuid
from kumo_sdk.resources.access import Applications, Invitations
from kumo_sdk.resources.admin import Admin
from kumo_sdk.resources.billing import Budgets, ForecastReport, Invoices, Points, Usage
from kumo_sdk.resources.compute import (
    Images,
    Leases,
    PlacementGroups,
    ReclamationReport,
    Templates,
    VirtualMachines,
)
from kumo_sdk.resources.events import AuditEvents, Events, Webhooks
from kumo_sdk.resources.network import (
    ExternalConnections,
    GlobalIps,
    Networks,
    PortForwards,
    Ports,
    SecurityGroupRules,
    SecurityGroups,
    Subnets,
)
from kumo_sdk.resources.operations import Operations
from kumo_sdk.resources.storage import AccessKeys, Buckets, Shares, Volumes
from kumo_sdk.resources.tenants import Members, Projects, Quota, SSHKeys, Tokens
from kumo_sdk.types import ApiToken, User, decode

API = "/api/v1/"
RETRY_STATUSES = frozenset({502, 503, 504})
# Failures after which the request may or may not have reached the server: retried, which
# the Idempotency-Key makes safe for POST.
RETRY_ERRORS = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)
__all__ = ["Client", "is_uuid", "mint_token"]


class Client:
    """A client of one Kumo server. ``url`` is the server's root (``http://host:8000``).

    ``transport`` replaces httpx's (tests, proxies); ``backoff`` is the first retry's delay in
    seconds, doubled on each further try (with jitter) and capped at 10 s; a 503's
    ``Retry-After`` is honoured up to that cap.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        project: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.project = project
        self.retries = retries
        self.backoff = backoff
        headers = {"Accept": "application/json", "User-Agent": "kumo-sdk"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    # The API's collections, one line each (see kumo_sdk.resource for adding one). Yours:
    projects = bind(Projects)
    tokens = bind(Tokens)
    ssh_keys = bind(SSHKeys)
    templates = bind(Templates)
    # A project's (the client's project, or project= on each call):
    members = bind(Members)
    quota = bind(Quota)
    images = bind(Images)
    vms = bind(VirtualMachines)
    placement_groups = bind(PlacementGroups)
    leases = bind(Leases)
    reclamation = bind(ReclamationReport)
    networks = bind(Networks)
    subnets = bind(Subnets)
    ports = bind(Ports)
    security_groups = bind(SecurityGroups)
    security_group_rules = bind(SecurityGroupRules)
    global_ips = bind(GlobalIps)
    port_forwards = bind(PortForwards)
    external_connections = bind(ExternalConnections)
    volumes = bind(Volumes)
    shares = bind(Shares)
    buckets = bind(Buckets)
    access_keys = bind(AccessKeys)
    usage = bind(Usage)
    forecast = bind(ForecastReport)
    invoices = bind(Invoices)
    budgets = bind(Budgets)
    points = bind(Points)
    operations = bind(Operations)
    events = bind(Events)
    audit_events = bind(AuditEvents)
    webhooks = bind(Webhooks)
    invitations = bind(Invitations)
    applications = bind(Applications)
    # The operators' (staff only): kumo.admin.hosts, kumo.admin.rate_cards, ...
    admin = bind(Admin)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def whoami(self) -> User:
        return decode(User, self.request("GET", "user/").json())

    # --- the transport ---------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one API request, with the retries described in the module docstring; return
        the successful answer or raise the error's exception. ``path`` is relative to
        ``/api/v1/``, or a URL the server gave (its path is used, against this client's
        server)."""
        url = self._path(path)
        headers = dict(headers or {})
        if method == "POST":
            headers["Idempotency-Key"] = idempotency_key or uuid.uuid4().hex
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, url, json=json, params=params, headers=headers
                )
            except RETRY_ERRORS as exc:
                if attempt >= self.retries:
                    raise errors.ConnectionFailed(f"{method} {url}: {exc!r}") from exc
                self._sleep(attempt, None)
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                    break
                self._sleep(attempt, response.headers.get("Retry-After"))
            attempt += 1
        if method == "DELETE" and attempt > 0 and response.status_code == 404:
            return response
        if response.is_error:
            raise errors.from_response(response)
        return response

    def _path(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            parsed = httpx.URL(path)
            return parsed.raw_path.decode()
        return path if path.startswith("/") else API + path

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff * 2**attempt * (0.5 + random.random() / 2)
        if retry_after and retry_after.isdigit():
            delay = max(delay, float(retry_after))
        time.sleep(min(delay, 10.0))

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None).json()

    def post(self, path: str, json: Any = None, *, idempotency_key: str | None = None) -> Any:
        response = self.request("POST", path, json=json, idempotency_key=idempotency_key)
        return response.json() if response.content else None

    def patch(self, path: str, json: Any = None) -> Any:
        response = self.request("PATCH", path, json=json)
        return response.json() if response.content else None

    def delete(self, path: str) -> Any:
        response = self.request("DELETE", path)
        return response.json() if response.status_code == 202 else None

    def paginate(self, path: str, *, page_size: int = 100, **params: Any) -> Iterator[Any]:
        """Every item of a paged list, one page request at a time, as the pages are read."""
        page = 1
        while True:
            body = self.get(path, page=page, page_size=page_size, **params)
            yield from body["results"]
            if not body.get("next"):
                return
            page += 1

    def project_path(self, project: str | None, rest: str) -> str:
        slug = project or self.project
        if not slug:
            raise ValueError("no project: pass project= or set the client's project")
        return f"projects/{slug}/{rest}"


def mint_token(
    url: str,
    username: str,
    password: str,
    *,
    name: str,
    project: str | None = None,
    expires_at: datetime | None = None,
    transport: httpx.BaseTransport | None = None,
    timeout: float = 30.0,
) -> ApiToken:
    """Log in with a username and password, make an API token named ``name`` (scoped to
    ``project`` when given), and log out: the password is sent once and not kept. The
    token's secret is in the answer's ``.token``. A wrong password raises
    AuthenticationFailed; too many, Throttled."""
    with Client(url, transport=transport, timeout=timeout) as session:
        login = session.post("auth/login/", {"username": username, "password": password})
        # Django's CSRF check: the token in a header, and (over HTTPS) a same-origin Referer.
        csrf = {"X-CSRFToken": login["csrf_token"], "Referer": f"{session.url}/"}
        body: dict[str, Any] = {"name": name, "project": project}
        if expires_at is not None:
            body["expires_at"] = expires_at.isoformat()
        token = session.request("POST", "user/tokens/", json=body, headers=csrf).json()
        session.request("POST", "auth/logout/", headers=csrf)
    return decode(ApiToken, token)
