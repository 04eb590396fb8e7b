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
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import httpx

from kumo_sdk import errors
from kumo_sdk.types import (
    AccessKey,
    ApiToken,
    Bucket,
    Forecast,
    GlobalIp,
    Image,
    Invoice,
    Network,
    Operation,
    Port,
    PortForward,
    Project,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
    Template,
    UsageRecord,
    User,
    VirtualMachine,
    Volume,
    decode,
)

T = TypeVar("T")

API = "/api/v1/"
RETRY_STATUSES = frozenset({502, 503, 504})
# Failures after which the request may or may not have reached the server: retried, which
# the Idempotency-Key makes safe for POST.
RETRY_ERRORS = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)
UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


def is_uuid(value: str) -> bool:
    return bool(UUID_RE.match(value))


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
        self.projects = Projects(self)
        self.tokens = Tokens(self)
        self.templates = Templates(self)
        self.images = Images(self)
        self.vms = VirtualMachines(self)
        self.networks = Networks(self)
        self.subnets = Subnets(self)
        self.ports = Ports(self)
        self.security_groups = SecurityGroups(self)
        self.global_ips = GlobalIps(self)
        self.port_forwards = PortForwards(self)
        self.volumes = Volumes(self)
        self.buckets = Buckets(self)
        self.access_keys = AccessKeys(self)
        self.usage = Usage(self)
        self.invoices = Invoices(self)
        self.operations = Operations(self)

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


# --- resources ------------------------------------------------------------------------------


class _Resource:
    def __init__(self, client: Client) -> None:
        self._c = client


def _listed(client: Client, cls: type[T], path: str, **params: Any) -> Iterator[T]:
    return (decode(cls, item) for item in client.paginate(path, **params))


def _missing(what: str, name: str, project: str | None) -> errors.NotFound:
    where = f" in project {project}" if project else ""
    return errors.NotFound(404, "not_found", f"no {what} {name!r}{where}")


class Projects(_Resource):
    def list(self) -> Iterator[Project]:
        return _listed(self._c, Project, "projects/")

    def get(self, slug: str) -> Project:
        return decode(Project, self._c.get(f"projects/{slug}/"))


class Tokens(_Resource):
    """Your API tokens. Revoking keeps a token listed, with ``revoked_at`` set."""

    def list(self) -> Iterator[ApiToken]:
        return _listed(self._c, ApiToken, "user/tokens/")

    def create(
        self, name: str, *, project: str | None = None, expires_at: datetime | None = None
    ) -> ApiToken:
        """A new token; its secret is in ``.token``, in this answer only."""
        body: dict[str, Any] = {"name": name, "project": project}
        if expires_at is not None:
            body["expires_at"] = expires_at.isoformat()
        return decode(ApiToken, self._c.post("user/tokens/", body))

    def revoke(self, token_id: int) -> None:
        self._c.delete(f"user/tokens/{token_id}/")


class Templates(_Resource):
    def list(self, *, page_size: int = 100, **filters: Any) -> Iterator[Template]:
        """Active templates; filters: ``gpus``, ``gpu_model``, ``spot_allowed``."""
        return _listed(self._c, Template, "templates/", page_size=page_size, **filters)

    def get(self, name: str) -> Template:
        return decode(Template, self._c.get(f"templates/{name}/"))


class Images(_Resource):
    def list(self, *, project: str | None = None) -> Iterator[Image]:
        """The images the project may boot: public ones and its own."""
        return _listed(self._c, Image, self._c.project_path(project, "images/"))

    def get(self, image_id: int, *, project: str | None = None) -> Image:
        return decode(Image, self._c.get(self._c.project_path(project, f"images/{image_id}/")))


class Operations(_Resource):
    def get(self, operation: Operation | str, *, project: str | None = None) -> Operation:
        """An operation by object, URL or id (an id is looked up in the project)."""
        if isinstance(operation, Operation):
            path = operation.url
        elif operation.startswith(("http://", "https://", "/")):
            path = operation
        else:
            path = self._c.project_path(project, f"operations/{operation}/")
        return decode(Operation, self._c.get(path))

    def wait(
        self,
        operation: Operation | str,
        *,
        project: str | None = None,
        timeout: float = 600.0,
        interval: float = 2.0,
        on_poll: Callable[[Operation], None] | None = None,
    ) -> Operation:
        """Poll until the operation finishes: return it when it succeeded, raise
        ``OperationFailed`` when it failed and ``OperationTimeout`` once ``timeout`` seconds
        have passed. Polls start at 0.2 s apart and slow to ``interval``; ``on_poll`` sees
        every state read."""
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            current = self.get(operation, project=project)
            if on_poll is not None:
                on_poll(current)
            if current.state == "succeeded":
                return current
            if current.state == "failed":
                raise errors.OperationFailed(current)
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.OperationTimeout(current, timeout)
            time.sleep(min(delay, left))
            delay = min(delay * 1.5, interval)
            operation = current


class VirtualMachines(_Resource):
    """A project's VMs. Every change answers 202 with an operation; ``wait=True`` waits for
    it (``timeout`` seconds) and returns the VM as it then is."""

    def list(self, *, project: str | None = None, **filters: Any) -> Iterator[VirtualMachine]:
        """Filters: ``state`` (one or a list), ``priority``, ``host``, ``name``. Deleted VMs
        are listed too (``state=deleted``)."""
        return _listed(self._c, VirtualMachine, self._c.project_path(project, "vms/"), **filters)

    def get(self, vm_id: str, *, project: str | None = None) -> VirtualMachine:
        return decode(VirtualMachine, self._c.get(self._c.project_path(project, f"vms/{vm_id}/")))

    def find(self, name_or_id: str, *, project: str | None = None) -> VirtualMachine:
        """The VM with this id, or the one not deleted with this name (NotFound otherwise)."""
        if is_uuid(name_or_id):
            return self.get(name_or_id, project=project)
        for vm in self.list(project=project, name=name_or_id):
            if vm.state != "deleted":
                return vm
        raise _missing("VM", name_or_id, project or self._c.project)

    def create(
        self,
        name: str,
        *,
        template: str,
        image: int,
        project: str | None = None,
        spot: bool = False,
        networks: list[str] | None = None,
        ssh_keys: list[str] | None = None,
        user_data: str = "",
        placement_group: str | None = None,
        wait_for_capacity: bool = True,
        wait: bool = False,
        timeout: float = 600.0,
        on_poll: Callable[[Operation], None] | None = None,
        idempotency_key: str | None = None,
    ) -> VirtualMachine:
        """Create a VM: one NIC per name in ``networks``, in order; ``ssh_keys`` are names of
        your SSH keys. Without ``wait`` the answer is the VM as accepted (usually pending or
        provisioning) with ``operation`` set; with it, the VM once the creation succeeded."""
        body: dict[str, Any] = {
            "name": name,
            "template": template,
            "image": image,
            "priority": "spot" if spot else "on_demand",
            "nics": [{"network": n} for n in networks or []],
            "ssh_keys": list(ssh_keys or []),
            "user_data": user_data,
            "wait_for_capacity": wait_for_capacity,
        }
        if placement_group:
            body["placement_group"] = placement_group
        path = self._c.project_path(project, "vms/")
        vm = decode(VirtualMachine, self._c.post(path, body, idempotency_key=idempotency_key))
        if not wait:
            return vm
        if vm.operation is None:
            raise errors.KumoError(f"the server named no operation for creating VM {vm.id}")
        self._c.operations.wait(vm.operation, timeout=timeout, on_poll=on_poll)
        return self.get(vm.id, project=project)

    def _act(self, vm_id: str, action: str, project: str | None, **wait: Any) -> Operation:
        path = self._c.project_path(project, f"vms/{vm_id}/")
        body = self._c.delete(path) if action == "delete" else self._c.post(f"{path}{action}/")
        operation = decode(Operation, body)
        if wait.pop("wait"):
            operation = self._c.operations.wait(operation, **wait)
        return operation

    def start(
        self,
        vm_id: str,
        *,
        project: str | None = None,
        wait: bool = False,
        timeout: float = 600.0,
        on_poll: Callable[[Operation], None] | None = None,
    ) -> Operation:
        return self._act(vm_id, "start", project, wait=wait, timeout=timeout, on_poll=on_poll)

    def stop(
        self,
        vm_id: str,
        *,
        project: str | None = None,
        wait: bool = False,
        timeout: float = 600.0,
        on_poll: Callable[[Operation], None] | None = None,
    ) -> Operation:
        """Stop the guest (gracefully first, then forcibly after the server's grace time)."""
        return self._act(vm_id, "stop", project, wait=wait, timeout=timeout, on_poll=on_poll)

    def reboot(
        self,
        vm_id: str,
        *,
        project: str | None = None,
        wait: bool = False,
        timeout: float = 600.0,
        on_poll: Callable[[Operation], None] | None = None,
    ) -> Operation:
        return self._act(vm_id, "reboot", project, wait=wait, timeout=timeout, on_poll=on_poll)

    def delete(
        self,
        vm_id: str,
        *,
        project: str | None = None,
        wait: bool = False,
        timeout: float = 600.0,
        on_poll: Callable[[Operation], None] | None = None,
    ) -> Operation:
        """Delete the VM (it stays listed as ``deleted``); its ports go with it."""
        return self._act(vm_id, "delete", project, wait=wait, timeout=timeout, on_poll=on_poll)


class Networks(_Resource):
    def list(self, *, project: str | None = None) -> Iterator[Network]:
        return _listed(self._c, Network, self._c.project_path(project, "networks/"))

    def get(self, network_id: str, *, project: str | None = None) -> Network:
        return decode(
            Network, self._c.get(self._c.project_path(project, f"networks/{network_id}/"))
        )

    def find(self, name_or_id: str, *, project: str | None = None) -> Network:
        if is_uuid(name_or_id):
            return self.get(name_or_id, project=project)
        for network in self.list(project=project):
            if network.name == name_or_id:
                return network
        raise _missing("network", name_or_id, project or self._c.project)

    def create(
        self,
        name: str,
        *,
        project: str | None = None,
        cidr: str = "",
        description: str = "",
        kind: str = "overlay",
        external_access: bool = False,
        idempotency_key: str | None = None,
    ) -> Network:
        """A network, with a first subnet when ``cidr`` is given; ``external_access`` joins
        the project router, which source-NATs it to the outside."""
        body = {
            "name": name,
            "cidr": cidr,
            "description": description,
            "kind": kind,
            "external_access": external_access,
        }
        path = self._c.project_path(project, "networks/")
        return decode(Network, self._c.post(path, body, idempotency_key=idempotency_key))

    def delete(self, network_id: str, *, project: str | None = None) -> None:
        """Delete an empty network (one with ports answers Conflict)."""
        self._c.delete(self._c.project_path(project, f"networks/{network_id}/"))


class Subnets(_Resource):
    def list(self, *, project: str | None = None) -> Iterator[Subnet]:
        return _listed(self._c, Subnet, self._c.project_path(project, "subnets/"))

    def create(
        self, network: str, cidr: str, *, project: str | None = None, name: str = ""
    ) -> Subnet:
        """A subnet of the network named ``network``; overlapping another answers InvalidInput."""
        body = {"network": network, "cidr": cidr, "name": name}
        return decode(Subnet, self._c.post(self._c.project_path(project, "subnets/"), body))

    def delete(self, subnet_id: int, *, project: str | None = None) -> None:
        self._c.delete(self._c.project_path(project, f"subnets/{subnet_id}/"))


class Ports(_Resource):
    def list(self, *, project: str | None = None) -> Iterator[Port]:
        return _listed(self._c, Port, self._c.project_path(project, "ports/"))

    def get(self, port_id: str, *, project: str | None = None) -> Port:
        return decode(Port, self._c.get(self._c.project_path(project, f"ports/{port_id}/")))


class SecurityGroups(_Resource):
    """Security groups and their rules (allow-lists; the ``default`` group cannot go)."""

    def list(self, *, project: str | None = None) -> Iterator[SecurityGroup]:
        return _listed(self._c, SecurityGroup, self._c.project_path(project, "security-groups/"))

    def find(self, name: str, *, project: str | None = None) -> SecurityGroup:
        for group in self.list(project=project):
            if group.name == name:
                return group
        raise _missing("security group", name, project or self._c.project)

    def create(
        self, name: str, *, project: str | None = None, description: str = ""
    ) -> SecurityGroup:
        body = {"name": name, "description": description}
        path = self._c.project_path(project, "security-groups/")
        return decode(SecurityGroup, self._c.post(path, body))

    def delete(self, group_id: int, *, project: str | None = None) -> None:
        self._c.delete(self._c.project_path(project, f"security-groups/{group_id}/"))

    def add_rule(
        self,
        group: str,
        *,
        direction: str,
        project: str | None = None,
        protocol: str = "any",
        port_min: int | None = None,
        port_max: int | None = None,
        remote_cidr: str = "",
        remote_group: str | None = None,
        description: str = "",
    ) -> SecurityGroupRule:
        """A rule in the group named ``group``: ``direction`` ingress or egress, ``protocol``
        any, tcp, udp or icmp; port ranges for tcp and udp only."""
        body: dict[str, Any] = {
            "group": group,
            "direction": direction,
            "protocol": protocol,
            "remote_cidr": remote_cidr,
            "description": description,
        }
        for key, value in (
            ("port_min", port_min),
            ("port_max", port_max),
            ("remote_group", remote_group),
        ):
            if value is not None:
                body[key] = value
        path = self._c.project_path(project, "security-group-rules/")
        return decode(SecurityGroupRule, self._c.post(path, body))

    def delete_rule(self, rule_id: int, *, project: str | None = None) -> None:
        self._c.delete(self._c.project_path(project, f"security-group-rules/{rule_id}/"))


class GlobalIps(_Resource):
    def list(self, *, project: str | None = None) -> Iterator[GlobalIp]:
        return _listed(self._c, GlobalIp, self._c.project_path(project, "global-ips/"))

    def find(self, address: str, *, project: str | None = None) -> GlobalIp:
        for gip in self.list(project=project):
            if gip.address == address:
                return gip
        raise _missing("global IP", address, project or self._c.project)

    def allocate(self, *, project: str | None = None, description: str = "") -> GlobalIp:
        """A new address from the operators' pools (QuotaExceeded past the project's quota)."""
        path = self._c.project_path(project, "global-ips/")
        return decode(GlobalIp, self._c.post(path, {"description": description}))

    def release(self, global_ip_id: int, *, project: str | None = None) -> None:
        self._c.delete(self._c.project_path(project, f"global-ips/{global_ip_id}/"))

    def associate(
        self, global_ip_id: int, port: str | None, *, project: str | None = None
    ) -> GlobalIp:
        """1:1 NAT the address to ``port`` (a port id); ``None`` dissociates it."""
        path = self._c.project_path(project, f"global-ips/{global_ip_id}/associate/")
        return decode(GlobalIp, self._c.post(path, {"port": port}))


class PortForwards(_Resource):
    def list(self, *, project: str | None = None) -> Iterator[PortForward]:
        return _listed(self._c, PortForward, self._c.project_path(project, "port-forwards/"))

    def create(
        self,
        global_ip: str,
        *,
        protocol: str,
        external_port: int,
        port: str,
        internal_port: int,
        project: str | None = None,
        description: str = "",
    ) -> PortForward:
        """DNAT ``global_ip:external_port`` (an address of the project) to ``port`` (a port
        id) at ``internal_port``."""
        body = {
            "global_ip": global_ip,
            "protocol": protocol,
            "external_port": external_port,
            "port": port,
            "internal_port": internal_port,
            "description": description,
        }
        path = self._c.project_path(project, "port-forwards/")
        return decode(PortForward, self._c.post(path, body))

    def delete(self, forward_id: int, *, project: str | None = None) -> None:
        self._c.delete(self._c.project_path(project, f"port-forwards/{forward_id}/"))


class Volumes(_Resource):
    """A project's block volumes. Changes answer at once (no operation): an attached
    volume reaches a running guest at its next boot."""

    def list(self, *, project: str | None = None, **filters: Any) -> Iterator[Volume]:
        """Filters: ``state`` (available, in_use, ...), ``tier``."""
        return _listed(self._c, Volume, self._c.project_path(project, "volumes/"), **filters)

    def get(self, volume_id: str, *, project: str | None = None) -> Volume:
        return decode(Volume, self._c.get(self._c.project_path(project, f"volumes/{volume_id}/")))

    def find(self, name_or_id: str, *, project: str | None = None) -> Volume:
        """The volume with this id or name (NotFound otherwise)."""
        if is_uuid(name_or_id):
            return self.get(name_or_id, project=project)
        for volume in self.list(project=project):
            if volume.name == name_or_id:
                return volume
        raise _missing("volume", name_or_id, project or self._c.project)

    def create(
        self,
        name: str,
        *,
        size_gib: int,
        project: str | None = None,
        tier: str | None = None,
        description: str = "",
        idempotency_key: str | None = None,
    ) -> Volume:
        """A volume of ``size_gib`` (counted against the storage quota at once: QuotaExceeded
        past it); ``tier`` is the server's default (shared) unless given."""
        body: dict[str, Any] = {"name": name, "size_gib": size_gib, "description": description}
        if tier is not None:
            body["tier"] = tier
        path = self._c.project_path(project, "volumes/")
        return decode(Volume, self._c.post(path, body, idempotency_key=idempotency_key))

    def attach(self, volume_id: str, vm: str, *, project: str | None = None) -> Volume:
        """Attach the volume to ``vm`` (a VM id of the project, placed: provisioning, running
        or stopped) as its next free disk; Conflict when either is not in a state for it."""
        path = self._c.project_path(project, f"volumes/{volume_id}/attach/")
        return decode(Volume, self._c.post(path, {"vm": vm}))

    def detach(self, volume_id: str, *, project: str | None = None) -> Volume:
        """Detach an attached volume (Conflict when it is not); its data stays."""
        path = self._c.project_path(project, f"volumes/{volume_id}/detach/")
        return decode(Volume, self._c.post(path))

    def extend(self, volume_id: str, size_gib: int, *, project: str | None = None) -> Volume:
        """Grow the volume to ``size_gib`` (never shrink it)."""
        path = self._c.project_path(project, f"volumes/{volume_id}/extend/")
        return decode(Volume, self._c.post(path, {"size_gib": size_gib}))

    def delete(self, volume_id: str, *, project: str | None = None) -> None:
        """Delete the volume and its data (Conflict while it is attached)."""
        self._c.delete(self._c.project_path(project, f"volumes/{volume_id}/"))


class Buckets(_Resource):
    """A project's S3 buckets, named as in S3 (names are global: a taken one is Conflict).
    Without an object store on the server every call answers Conflict."""

    def list(self, *, project: str | None = None) -> Iterator[Bucket]:
        return _listed(self._c, Bucket, self._c.project_path(project, "buckets/"))

    def get(self, name: str, *, project: str | None = None) -> Bucket:
        return decode(Bucket, self._c.get(self._c.project_path(project, f"buckets/{name}/")))

    def create(
        self,
        name: str,
        *,
        quota_gib: int,
        project: str | None = None,
        idempotency_key: str | None = None,
    ) -> Bucket:
        path = self._c.project_path(project, "buckets/")
        body = {"name": name, "quota_gib": quota_gib}
        return decode(Bucket, self._c.post(path, body, idempotency_key=idempotency_key))

    def delete(self, name: str, *, project: str | None = None) -> None:
        """Delete the bucket and everything it holds."""
        self._c.delete(self._c.project_path(project, f"buckets/{name}/"))


class AccessKeys(_Resource):
    """A project's S3 access keys (they reach every bucket of the project); project admins
    make and delete them."""

    def list(self, *, project: str | None = None) -> Iterator[AccessKey]:
        return _listed(self._c, AccessKey, self._c.project_path(project, "access-keys/"))

    def find(self, access_key_id: str, *, project: str | None = None) -> AccessKey:
        for key in self.list(project=project):
            if key.access_key_id == access_key_id:
                return key
        raise _missing("access key", access_key_id, project or self._c.project)

    def create(
        self,
        *,
        project: str | None = None,
        description: str = "",
        idempotency_key: str | None = None,
    ) -> AccessKey:
        """A new key; its secret is in ``.secret_access_key``, in this answer only."""
        path = self._c.project_path(project, "access-keys/")
        body = {"description": description}
        return decode(AccessKey, self._c.post(path, body, idempotency_key=idempotency_key))

    def delete(self, key_id: int, *, project: str | None = None) -> None:
        """Revoke the key (by its numeric ``id``): it stops working at once."""
        self._c.delete(self._c.project_path(project, f"access-keys/{key_id}/"))


class Usage(_Resource):
    """What the project used, and this month's forecast."""

    def list(self, *, project: str | None = None, **filters: Any) -> Iterator[UsageRecord]:
        """Usage intervals. Filters: ``resource``, ``priority``, ``subject_type``,
        ``subject_id``, ``open`` (still in use), ``started_after``, ``started_before``
        (datetimes or ISO 8601 strings), ``ordering``."""
        params = {
            key: value.isoformat() if isinstance(value, datetime) else value
            for key, value in filters.items()
            if value is not None
        }
        path = self._c.project_path(project, "usage-records/")
        return _listed(self._c, UsageRecord, path, **params)

    def forecast(self, *, project: str | None = None) -> Forecast:
        return decode(Forecast, self._c.get(self._c.project_path(project, "forecast/")))


class Invoices(_Resource):
    """A project's monthly invoices."""

    def list(self, *, project: str | None = None, **filters: Any) -> Iterator[Invoice]:
        """Filters: ``period_start`` (a month's first day, ISO 8601), ``ordering``."""
        return _listed(self._c, Invoice, self._c.project_path(project, "invoices/"), **filters)

    def get(self, invoice_id: int, *, project: str | None = None) -> Invoice:
        path = self._c.project_path(project, f"invoices/{invoice_id}/")
        return decode(Invoice, self._c.get(path))

    def download(
        self, invoice_id: int, *, format: str = "csv", project: str | None = None
    ) -> bytes:
        """The invoice's document as bytes: ``csv`` (a header, the lines, a total row) or
        ``json`` (its canonical document, the bytes ``content_hash`` is the SHA-256 of)."""
        if format not in ("csv", "json"):
            raise ValueError(f"format must be csv or json, not {format!r}")
        path = self._c.project_path(project, f"invoices/{invoice_id}/{format}/")
        return self._c.request("GET", path).content


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
