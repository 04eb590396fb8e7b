"""Templates, images and VMs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kumo_sdk import errors
from kumo_sdk.resource import CREATE, DELETE, READ, UPDATE, Resource, Singleton
from kumo_sdk.types import (
    ConsoleTicket,
    Image,
    Lease,
    Operation,
    PlacementGroup,
    Reclamation,
    Template,
    VirtualMachine,
    decode,
)


class Templates(Resource[Template]):
    """Active templates; ``list`` filters: ``gpus``, ``gpu_model``, ``spot_allowed``."""

    path, type, project_scoped, key, find_by = "templates/", Template, False, "name", None


def upload_file(client, path: str, source: str | os.PathLike) -> dict[str, Any]:
    """PUT the file at ``source`` to ``path`` (an image's ``file/``), streamed from disk with
    its Content-Length; not retried (the body cannot be replayed)."""
    size = os.path.getsize(source)
    with open(source, "rb") as f:
        response = client._http.request(
            "PUT",
            client._path(path),
            content=iter(lambda: f.read(1 << 20), b""),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            timeout=None,
        )
    if response.is_error:
        raise errors.from_response(response)
    return response.json()


class Images(Resource[Image]):
    """The images the project may boot: public ones and its own. ``create(name,
    os_distro=..., format=..., login_user=..., checksum=...)`` registers one of the
    project's own (members; it is ``uploading``), ``upload(id, path)`` streams its bytes
    (it turns ``active``, or ``failed`` with the reason); ``delete`` removes it (409 while
    a VM uses it)."""

    path, type = "images/", Image
    verbs = READ | {CREATE, DELETE}

    def upload(self, key: Any, source: str | os.PathLike, *, project: str | None = None) -> Image:
        return self._decode(upload_file(self._c, self._item(key, project) + "file/", source))


class PlacementGroups(Resource[PlacementGroup]):
    """``create(name, policy=...)``: affinity, anti-affinity or compact (one rack); a VM
    joins one with ``vms.create(..., placement_group=name)``."""

    path, type = "placement-groups/", PlacementGroup
    verbs = READ | {CREATE, DELETE}


class Leases(Resource[Lease]):
    """Reservations of GPUs over a period. ``create(name, gpus=n, starts_at=..., ends_at=...,
    gpu_model=...)``, or ``hosts=n`` for whole hosts instead of ``gpus`` (admins; datetimes or
    ISO 8601 strings), answers 409 when it does not fit,
    with the earliest period that does in ``details["earliest_starts_at"]``; ``cancel``
    drops one not started (billed nothing) or ends one now (its VMs are shelved);
    ``update(id, lend_idle=False)`` keeps its idle GPUs for its VMs from now on (the spot
    VMs borrowing them get their eviction notice now), ``True`` lends them again;
    ``update(id, ends_at=...)`` moves its end (later is admitted again for the time it adds:
    409 with ``details["latest_ends_at"]`` when it does not fit), ``starts_at=...`` its
    start before it holds GPUs; ``update(id, gpus=n)`` makes it hold n GPUs from now on.
    ``list``
    filters: ``state``, ``ends_after`` and ``starts_before`` (a calendar's window)."""

    path, type = "leases/", Lease
    verbs = READ | {CREATE, UPDATE}

    def _find_filters(self, name: str) -> dict[str, Any]:
        return {"name": name}

    def _findable(self, item: Lease) -> bool:
        return item.state in ("scheduled", "preparing", "active")

    def create(  # type: ignore[override]
        self,
        name: str,
        *,
        starts_at: Any,
        ends_at: Any,
        gpus: int | None = None,
        hosts: int | None = None,
        gpu_model: str = "",
        lend_idle: bool = True,
        project: str | None = None,
    ) -> Lease:
        body: dict[str, Any] = {
            "name": name,
            "gpu_model": gpu_model,
            "starts_at": _iso(starts_at),
            "ends_at": _iso(ends_at),
            "lend_idle": lend_idle,
        }
        if gpus is not None:
            body["gpus"] = gpus
        if hosts is not None:
            body["hosts"] = hosts
        return self._decode(self._c.post(self._base(project), body))

    def cancel(self, key: Any, *, project: str | None = None) -> Lease:
        return self._decode(self._action(key, "cancel", project=project))


def _iso(value: Any) -> str:
    return value if isinstance(value, str) else value.isoformat()


class ReclamationReport(Singleton[Reclamation]):
    """The project's reclamation: status, guaranteed minimum, thresholds, steps scheduled."""

    path, type = "reclamation/", Reclamation


def _vm_action(path: str, doc: str):
    """A VM action method: POST ``vms/<id>/<path>/`` (202 with an operation); ``wait`` waits
    for the operation (``timeout`` seconds, ``on_poll`` called on each poll)."""

    def act(
        self: VirtualMachines,
        vm_id: str,
        *,
        project: str | None = None,
        wait: bool = False,
        timeout: float = 600.0,
        on_poll: Callable[[Operation], None] | None = None,
    ) -> Operation:
        return self._act(vm_id, path, project, wait=wait, timeout=timeout, on_poll=on_poll)

    act.__name__ = act.__qualname__ = path.replace("-", "_")
    act.__doc__ = doc
    return act


class VirtualMachines(Resource[VirtualMachine]):
    """A project's VMs. Every change answers 202 with an operation; ``wait=True`` waits for
    it (``timeout`` seconds) and returns the VM as it then is. ``list`` filters: ``state``
    (one or a list), ``priority``, ``host``, ``name``; deleted VMs are listed too
    (``state=deleted``). ``find`` matches an id, or a name among the VMs not deleted."""

    path, type, uuid_key, noun = "vms/", VirtualMachine, True, "VM"
    verbs = READ | {CREATE, DELETE}

    def _find_filters(self, name: str) -> dict[str, Any]:
        return {"name": name}

    def _findable(self, item: VirtualMachine) -> bool:
        return item.state != "deleted"

    def create(  # type: ignore[override]
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
        lease: str | None = None,
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
        if lease:
            body["lease"] = lease
        path = self._base(project)
        vm = self._decode(self._c.post(path, body, idempotency_key=idempotency_key))
        if not wait:
            return vm
        if vm.operation is None:
            raise errors.KumoError(f"the server named no operation for creating VM {vm.id}")
        self._c.operations.wait(vm.operation, timeout=timeout, on_poll=on_poll)
        return self.get(vm.id, project=project)

    def _act(
        self,
        vm_id: str,
        action: str,
        project: str | None,
        *,
        wait: bool,
        timeout: float,
        on_poll: Callable[[Operation], None] | None,
    ) -> Operation:
        if action == "delete":
            body = self._c.delete(self._item(vm_id, project))
        else:
            body = self._action(vm_id, action, project=project)
        operation = decode(Operation, body)
        if wait:
            operation = self._c.operations.wait(operation, timeout=timeout, on_poll=on_poll)
        return operation

    start = _vm_action("start", "Start a stopped VM (or an evicted one: it waits for room).")
    stop = _vm_action("stop", "Stop the guest: gracefully, forcibly past the server's grace.")
    shelve = _vm_action(
        "shelve",
        "Stop the VM, keep its root disk and release every claim (GPUs, vCPUs, memory, host);"
        " it then bills its disk only.",
    )
    unshelve = _vm_action(
        "unshelve", "Place a shelved VM again where it fits (or wait) and boot its kept disk."
    )
    reboot = _vm_action("reboot", "Reboot the guest (gracefully: its OS is asked).")
    reset = _vm_action("reset", "Hard-reset a running VM (the reset button: its OS is not asked).")
    power_off = _vm_action(
        "power-off",
        "Power a running VM off at once (its OS is not asked); also while a graceful stop or"
        " reboot hangs.",
    )

    def console(self, vm_id: str, *, project: str | None = None) -> ConsoleTicket:
        """A token to the running VM's interactive serial console: ``url`` is the console
        proxy's websocket (token included) to open within the token's minute; it connects
        once. Raw bytes go both ways in binary frames. 409 when the VM is not running."""
        return decode(ConsoleTicket, self._c.post(f"{self._item(vm_id, project)}console/"))

    def console_log(
        self,
        vm_id: str,
        *,
        project: str | None = None,
        lines: int | None = None,
        max_bytes: int | None = None,
        timeout: float = 60.0,
    ) -> str:
        """The last 64 KiB (or ``max_bytes``, or the last ``lines``) of what the guest
        printed on its serial console. When its host is slow to answer, the server gives an
        operation, which this waits for (``timeout``)."""
        params: dict[str, Any] = {}
        if lines:
            params["lines"] = lines
        if max_bytes:
            params["bytes"] = max_bytes
        body = self._c.get(f"{self._item(vm_id, project)}console-log/", **params)
        if "output" in body:
            return body["output"]
        operation = self._c.operations.wait(decode(Operation, body), timeout=timeout)
        output = str((operation.result or {}).get("output", ""))
        return "".join(output.splitlines(keepends=True)[-lines:]) if lines else output

    def delete(  # type: ignore[override]
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
