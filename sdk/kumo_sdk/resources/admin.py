"""The operators' endpoints (``/api/v1/admin/…``, staff only): ``kumo.admin.<resource>``."""

from __future__ import annotations

import os
from datetime import date
from typing import Any

from kumo_sdk.resource import (
    CREATE,
    DELETE,
    LIST,
    READ,
    UPDATE,
    Namespace,
    Resource,
    bind,
)
from kumo_sdk.resources.access import InstitutionReviewers, Users
from kumo_sdk.resources.operations import Operations
from kumo_sdk.types import (
    AuditEvent,
    Bucket,
    CapacityGuarantee,
    Device,
    ExternalConnection,
    GlobalIpPool,
    Host,
    HostNetwork,
    Image,
    Invoice,
    InvoiceVerification,
    Lease,
    Operation,
    OperatorPointsEntry,
    OperatorProject,
    Quota,
    RateCard,
    Share,
    Template,
    VirtualMachine,
    Volume,
    decode,
)


class _Admin(Resource[Any]):
    project_scoped = False


class AdminProjects(_Admin):
    """Every project: ``create(slug=..., name=..., owner=...)``, ``update(slug, ...)``
    (status, validity), and its quota limits."""

    path, type, key, find_by, create_args = "admin/projects/", OperatorProject, "slug", None, ()
    verbs = READ | {CREATE, UPDATE}

    def quota(self, slug: str) -> Quota:
        return decode(Quota, self._c.get(f"{self._item(slug, None)}quota/"))

    def set_quota(self, slug: str, **limits: int) -> Quota:
        """Change the given limits (``vcpus``, ``memory_gib``, ``gpus``, ``vms``,
        ``networks``, ``global_ips``, ``storage_gib``, ``buckets``); the others stay."""
        return decode(Quota, self._c.patch(f"{self._item(slug, None)}quota/", limits))


class Hosts(_Admin):
    """The fleet's hosts by name: ``update(name, rack=..., zone=..., cpu_allocation_ratio=...,
    ram_allocation_ratio=...)``, ``set_state`` (drain, maintenance, back in service), and
    asking a host's agent to answer (``ping``) or list its guests (``guests``)."""

    path, type, key, find_by = "admin/hosts/", Host, "name", None
    verbs = READ | {UPDATE}

    def set_state(self, name: str, state: str, *, reason: str = "") -> Host:
        body = {"state": state, "reason": reason}
        return decode(Host, self._action(name, "state", body))

    def ping(self, name: str) -> Operation:
        return decode(Operation, self._action(name, "ping"))

    def guests(self, name: str) -> Operation:
        """The guests libvirt holds on the host, in the operation's result."""
        return decode(Operation, self._action(name, "guests"))


class Devices(_Admin):
    """PCI devices of every host (GPUs, RDMA functions) and the VM holding each."""

    path, type, find_by = "admin/devices/", Device, None


class AdminTemplates(_Admin):
    """Templates, active or not: ``create(name, vcpus=..., memory_gib=..., gpus=...,
    gpu_model=..., eviction_notice_s=...)``, ``update(name, active=False, ...)``."""

    path, type, key, find_by = "admin/templates/", Template, "name", None
    verbs = READ | {CREATE, UPDATE}


class AdminImages(_Admin):
    """Public images: ``create(name, os_distro=..., format=..., login_user=...)`` then
    ``upload(id, path)``."""

    path, type = "admin/images/", Image
    verbs = READ | {CREATE, DELETE}

    def upload(self, key: Any, source: str | os.PathLike) -> Image:
        from kumo_sdk.resources.compute import upload_file

        return self._decode(upload_file(self._c, self._item(key, None) + "file/", source))


class AdminVms(_Admin):
    """Every project's VMs; ``describe`` reads a VM's domain XML from its host."""

    path, type, find_by, noun = "admin/vms/", VirtualMachine, None, "VM"

    def describe(self, vm_id: str) -> Operation:
        return decode(Operation, self._action(vm_id, "describe"))


class AdminLeases(_Admin):
    """Every project's leases (the fleet's calendar: ``ends_after``, ``starts_before``);
    ``cancel`` any, or ``update(id, lend_idle=False)`` whether it lends its idle GPUs and
    ``update(id, ends_at=...)`` when it ends, ``update(id, gpus=n)`` its size."""

    path, type, find_by = "admin/leases/", Lease, None
    verbs = READ | {UPDATE}

    def cancel(self, key: Any) -> Lease:
        return self._decode(self._action(key, "cancel"))


class CapacityGuarantees(_Admin):
    """Projects' guaranteed GPU minimums: ``update(project, min_gpus=n)`` sets one."""

    path, type, key, find_by = "admin/capacity-guarantees/", CapacityGuarantee, "project", None
    verbs, update_method = READ | {UPDATE}, "PUT"


class GlobalIpPools(_Admin):
    """Pools of global addresses: ``create(name, cidr=..., gateway_ip=..., pool_start=...,
    pool_end=...)``."""

    path, type, noun = "admin/global-ip-pools/", GlobalIpPool, "global IP pool"
    verbs = READ | {CREATE, DELETE}


class AdminExternalConnections(_Admin):
    """Every project's external connections; ``approve`` realizes one, ``reject`` refuses it."""

    path, type, noun = "admin/external-connections/", ExternalConnection, "external connection"

    def approve(self, connection_id: int, *, note: str = "") -> ExternalConnection:
        return decode(ExternalConnection, self._action(connection_id, "approve", {"note": note}))

    def reject(self, connection_id: int, *, note: str = "") -> ExternalConnection:
        return decode(ExternalConnection, self._action(connection_id, "reject", {"note": note}))


class HostNetworks(_Admin):
    """Each host's network agent and how far it has converged; ``resync`` sends it its whole
    desired state again."""

    path, type, key, find_by = "admin/host-networks/", HostNetwork, "host", None

    def resync(self, host: str) -> HostNetwork:
        return decode(HostNetwork, self._action(host, "resync"))


class AdminVolumes(_Admin):
    path, type = "admin/volumes/", Volume


class AdminShares(_Admin):
    path, type = "admin/shares/", Share


class AdminBuckets(_Admin):
    path, type, key, find_by = "admin/buckets/", Bucket, "name", None


class RateCards(_Admin):
    """Rate card versions (never edited): ``create(valid_from=..., currency=...,
    spot_factor=..., reserved_factor=..., prices=[{"resource": ..., "model": ...,
    "unit_price": ...}])``; the previous version ends where it starts."""

    path, type, find_by, create_args = "admin/rate-cards/", RateCard, None, ()
    verbs = READ | {CREATE}


class AdminInvoices(_Admin):
    """Every project's invoices; ``issue`` issues a month's (idempotent: issuing again
    changes nothing)."""

    path, type, find_by = "admin/invoices/", Invoice, None

    def issue(self, period: str | date, *, project: str | None = None) -> list[Invoice]:
        """Issue the invoices of ``period`` (``2026-10`` or a date in it), of every project
        or of ``project``; the invoices issued."""
        if isinstance(period, date):
            period = f"{period:%Y-%m}"
        body: dict[str, Any] = {"period": period}
        if project is not None:
            body["project"] = project
        answer = self._c.post(f"{self.path}issue/", body)
        items = answer["results"] if isinstance(answer, dict) else answer
        return [decode(Invoice, item) for item in items]

    def verify(self, invoice_id: int) -> InvoiceVerification:
        return decode(InvoiceVerification, self._c.get(f"{self._item(invoice_id, None)}verify/"))

    def download(self, invoice_id: int, *, format: str = "csv") -> bytes:
        if format not in ("csv", "json"):
            raise ValueError(f"format must be csv or json, not {format!r}")
        return self._c.request("GET", f"{self._item(invoice_id, None)}{format}/").content


class AdminPoints(_Admin):
    """The points ledger of every project: ``create(project=..., amount=..., kind=...,
    note=...)`` grants (or adjusts) points."""

    path, type, find_by, create_args = "admin/points/", OperatorPointsEntry, None, ()
    verbs, noun = frozenset({LIST, CREATE}), "points entry"


class AdminOperations(Operations):
    project_scoped = False
    path = "admin/operations/"


class AdminAuditEvents(_Admin):
    """The whole audit trail (every project, the admin console, logins)."""

    path, type, find_by, noun = "admin/audit-events/", AuditEvent, None, "audit event"


class Admin(Namespace):
    """The operators' collections; every call needs a staff user's token."""

    projects = bind(AdminProjects)
    hosts = bind(Hosts)
    devices = bind(Devices)
    templates = bind(AdminTemplates)
    images = bind(AdminImages)
    vms = bind(AdminVms)
    capacity_guarantees = bind(CapacityGuarantees)
    leases = bind(AdminLeases)
    global_ip_pools = bind(GlobalIpPools)
    external_connections = bind(AdminExternalConnections)
    host_networks = bind(HostNetworks)
    volumes = bind(AdminVolumes)
    shares = bind(AdminShares)
    buckets = bind(AdminBuckets)
    rate_cards = bind(RateCards)
    invoices = bind(AdminInvoices)
    points = bind(AdminPoints)
    operations = bind(AdminOperations)
    audit_events = bind(AdminAuditEvents)
    users = bind(Users)
    institution_reviewers = bind(InstitutionReviewers)
