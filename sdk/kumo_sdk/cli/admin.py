"""`kumo admin`: the operators' commands (staff tokens only): hosts and what their libvirt
holds, VMs, devices, public images, rate cards, invoices, capacity guarantees, institutional
reviewers."""

import re
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    CliError,
    Json,
    Timeout,
    Wait,
    command,
    connect,
    group,
    show,
    wait_operation,
)
from kumo_sdk.cli.image import must_be_file, uploaded
from kumo_sdk.cli.invoice import FormatOpt, InvoiceFormat, InvoiceId, OutputOpt, emit_download
from kumo_sdk.cli.lease import (
    Ends,
    Extend,
    Gpus,
    LendIdle,
    Start,
    changes_said,
    lease_changed,
)
from kumo_sdk.cli.operation import show_operation
from kumo_sdk.client import Client
from kumo_sdk.errors import NotFound, OperationFailed
from kumo_sdk.types import Operation

app = group(
    "Operators only: hosts, VMs, devices, public images, rate cards, invoices, capacity "
    "guarantees, reviewers."
)
host_app = group("The fleet's hosts.")
vm_app = group("Every project's VMs, as their hosts' libvirt holds them.")
device_app = group("The hosts' PCI devices (GPUs, RDMA functions).")
image_app = group("Public images.")
rate_app = group("Rate card versions.")
invoice_app = group("Every project's invoices.")
guarantee_app = group("Projects' guaranteed GPU minimums.")
operation_app = group("Every operation: any project's, and the hosts' (which have none).")
app.add_typer(host_app, name="host")
app.add_typer(vm_app, name="vm")
app.add_typer(device_app, name="device")
app.add_typer(image_app, name="image")
app.add_typer(rate_app, name="rate-card")
app.add_typer(invoice_app, name="invoice")
reviewer_app = group(
    "Institutional reviewers: who reviews the applications of one institution's people."
)
app.add_typer(guarantee_app, name="guarantee")
app.add_typer(operation_app, name="operation")
app.add_typer(reviewer_app, name="reviewer")


@command(host_app, "list")
def host_list(ctx: typer.Context, json: Json = False) -> None:
    """Hosts with their state and use."""
    with connect(ctx) as kumo:
        hosts = list(kumo.admin.hosts.list())
    show(
        hosts,
        json,
        ["NAME", "STATE", "ZONE", "RACK", "VCPUS USED", "MEMORY MIB USED", "GPUS FREE"],
        lambda h: [
            h.name,
            h.state + (f" ({h.state_reason})" if h.state_reason else ""),
            h.zone,
            h.rack,
            f"{h.vcpus_used}/{h.vcpus}",
            f"{h.memory_mib_used}/{h.memory_mib}",
            f"{h.gpus_free}/{h.gpus}",
        ],
    )


@command(host_app, "state")
def host_state(
    ctx: typer.Context,
    name: str,
    state: Annotated[str, typer.Argument(help="up (back in service), draining or maintenance.")],
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
) -> None:
    """Drain a host, put it in maintenance, or return it to service."""
    with connect(ctx) as kumo:
        host = kumo.admin.hosts.set_state(name, state, reason=reason)
    output.note(f"Host {host.name} is {host.state}.")


def _answer(
    kumo: Client, operation: Operation, asked: str, wait: bool, timeout: float, json: bool
) -> Operation | None:
    """A question put to a host (an operation): without ``wait``, its id and where to follow
    it, and None; with ``wait``, the operation once it succeeded (one that failed is printed
    with ``--json``, then raised for ``command`` to report)."""
    if not wait:
        if json:
            output.emit_json(operation.raw)
        else:
            output.note(
                f"Asked {asked}: operation {operation.id}; its answer will be in its result:"
                f" kumo admin operation show {operation.id} --wait."
            )
        return None
    try:
        return wait_operation(
            kumo.admin.operations, operation, label=f"operation {operation.id}", timeout=timeout
        )
    except OperationFailed as failed:
        if json:
            output.emit_json(failed.operation.raw)
        raise


@command(operation_app, "show")
def admin_operation_show(
    ctx: typer.Context,
    operation_id: Annotated[str, typer.Argument(metavar="ID", help="The operation's id.")],
    wait: Wait = False,
    timeout: Timeout = 600.0,
    json: Json = False,
) -> None:
    """Any operation: its object, state, result or error (a host's answer is its result).
    With --wait, poll until it finishes; one that failed exits with 1."""
    with connect(ctx) as kumo:
        show_operation(kumo.admin.operations, operation_id, wait=wait, timeout=timeout, json=json)


@command(host_app, "guests")
def host_guests(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The host's name (kumo admin host list).")
    ],
    wait: Wait = False,
    timeout: Timeout = 600.0,
    json: Json = False,
) -> None:
    """Ask a host's agent for the Kumo guests its libvirt holds. With --wait, list them: NAME
    is the VM Kumo places on that host under the guest's id (none: Kumo has no VM for it
    there)."""
    with connect(ctx) as kumo:
        operation = kumo.admin.hosts.guests(name)
        done = _answer(kumo, operation, f"host {name} for its guests", wait, timeout, json)
        if done is None:
            return None
        if json:
            return output.emit_json(done.raw)
        guests = done.result.get("guests")
        if not isinstance(guests, list):  # an answer this CLI does not know: as it came
            return output.emit_json(done.result)
        names = {vm.id: vm.name for vm in kumo.admin.vms.list(host=name)}
    output.note(f"Kumo guests in host {name}'s libvirt: {len(guests)}.")
    output.table(
        ["VM ID", "NAME", "POWER", "GENERATION", "CPU SECONDS"],
        [
            [
                g.get("vm_id"),
                names.get(g.get("vm_id")),
                g.get("power"),
                g.get("generation"),
                f"{g['cpu_time_ns'] / 1e9:.1f}" if g.get("cpu_time_ns") is not None else None,
            ]
            for g in guests
        ],
    )


@command(vm_app, "describe")
def vm_describe(
    ctx: typer.Context,
    vm_id: Annotated[str, typer.Argument(metavar="VM_ID", help="The VM's id (any project's).")],
    wait: Wait = False,
    timeout: Timeout = 600.0,
    json: Json = False,
) -> None:
    """Ask a VM's host for the guest as libvirt holds it. With --wait, print its domain XML
    as is (its power state and generation on standard error)."""
    with connect(ctx) as kumo:
        operation = kumo.admin.vms.describe(vm_id)
        done = _answer(kumo, operation, f"VM {vm_id}'s host for its domain", wait, timeout, json)
    if done is None:
        return None
    if json:
        return output.emit_json(done.raw)
    xml = done.result.get("domain_xml")
    if not isinstance(xml, str):  # an answer this CLI does not know: as it came
        return output.emit_json(done.result)
    output.note(
        f"VM {vm_id} as libvirt holds it: {done.result.get('power')}, generation "
        f"{done.result.get('generation')}."
    )
    typer.echo(xml, nl=not xml.endswith("\n"))


@command(device_app, "list")
def device_list(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Only this host's devices.")] = None,
    json: Json = False,
) -> None:
    """PCI devices and the VM holding each."""
    with connect(ctx) as kumo:
        devices = list(kumo.admin.devices.list(host=host))
    show(
        devices,
        json,
        ["ID", "HOST", "PCI", "KIND", "MODEL", "NUMA", "VM"],
        lambda d: [d.id, d.host, d.pci_address, d.kind, d.model, d.numa_node, d.vm],
    )


@command(rate_app, "list")
def rate_card_list(ctx: typer.Context, json: Json = False) -> None:
    """Rate card versions and their prices."""
    with connect(ctx) as kumo:
        cards = list(kumo.admin.rate_cards.list())
    show(
        cards,
        json,
        ["ID", "VERSION", "FROM", "UNTIL", "CURRENCY", "SPOT", "RESERVED", "PRICES"],
        lambda c: [
            c.id,
            c.version,
            c.valid_from,
            c.valid_until,
            c.currency,
            c.spot_factor,
            c.reserved_factor,
            [f"{p.resource}{' ' + p.model if p.model else ''}: {p.unit_price}" for p in c.prices],
        ],
    )


def _public_image_id(kumo: Client, image: str) -> int:
    """An id as given; a name as the one public image of that name awaiting its file."""
    if image.isdigit():
        return int(image)
    found = kumo.admin.images.list(name=image, visibility="public", state="uploading")
    ids = [i.id for i in found]
    if not ids:
        raise NotFound(404, "not_found", f"no public image named {image!r} is uploading")
    if len(ids) > 1:
        raise CliError(f"{len(ids)} public images named {image!r} are uploading (ids {ids})")
    return ids[0]


@command(image_app, "upload")
def image_upload(
    ctx: typer.Context,
    image: Annotated[
        str,
        typer.Argument(
            metavar="IMAGE", help="The public image's id or name (it is uploading: just made)."
        ),
    ],
    path: Annotated[Path, typer.Argument(metavar="FILE", help="The disk image file.")],
    json: Json = False,
) -> None:
    """Upload a public image's file: streamed from the file, checked by SHA-256."""
    must_be_file(path, "FILE")
    with connect(ctx) as kumo:
        done = kumo.admin.images.upload(_public_image_id(kumo, image), path)
    uploaded(done, json)


def _period(text: str) -> str | date:
    """``YYYY-MM`` as given, or a date in the month."""
    if re.fullmatch(r"[0-9]{4}-(0[1-9]|1[0-2])", text):
        return text
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither a month (YYYY-MM) nor a date (YYYY-MM-DD)",
            param_hint="PERIOD",
        ) from None


@command(invoice_app, "issue")
def invoice_issue(
    ctx: typer.Context,
    period: Annotated[
        str,
        typer.Argument(
            metavar="PERIOD", help="The month, YYYY-MM, or a date in it; it must have ended."
        ),
    ],
    project: Annotated[
        str | None,
        typer.Option(help="Only this project's (its slug); else every project with usage."),
    ] = None,
    json: Json = False,
) -> None:
    """Issue a month's invoices; a project invoiced already keeps its own (not listed)."""
    month = _period(period)
    with connect(ctx) as kumo:
        issued = kumo.admin.invoices.issue(month, project=project)
    if not issued and not json:
        label = month if isinstance(month, str) else f"{month:%Y-%m}"
        output.note(f"No new invoice for {label}: no usage, or invoiced already.")
    show(
        issued,
        json,
        ["ID", "PROJECT", "PERIOD", "CURRENCY", "TOTAL", "DUE", "ISSUED"],
        lambda i: [
            i.id,
            i.project,
            f"{i.period_start:%Y-%m}",
            i.currency,
            i.total,
            i.amount_due,
            i.issued_at,
        ],
    )


@command(invoice_app, "download")
def invoice_download(
    ctx: typer.Context,
    invoice_id: InvoiceId,
    format: FormatOpt = InvoiceFormat.csv,
    out: OutputOpt = None,
) -> None:
    """Download any project's invoice as CSV or JSON, to standard output or a file."""
    with connect(ctx) as kumo:
        body = kumo.admin.invoices.download(invoice_id, format=format.value)
    emit_download(invoice_id, body, out)


@command(guarantee_app, "list")
def guarantee_list(ctx: typer.Context, json: Json = False) -> None:
    """Projects with a guaranteed GPU minimum."""
    with connect(ctx) as kumo:
        found = list(kumo.admin.capacity_guarantees.list())
    show(
        found,
        json,
        ["PROJECT", "MIN GPUS", "GPU MODEL", "MIN VCPUS", "UPDATED"],
        lambda g: [g.project, g.min_gpus, g.gpu_model, g.min_vcpus, g.updated_at],
    )


@command(guarantee_app, "set")
def guarantee_set(
    ctx: typer.Context,
    project: str,
    min_gpus: int,
    gpu_model: Annotated[str, typer.Option(help="GPU model (empty: the only one).")] = "",
    min_vcpus: Annotated[int, typer.Option(help="Guaranteed vCPUs.")] = 0,
) -> None:
    """Set a project's guaranteed minimum (0 removes it); refused beyond the fleet."""
    with connect(ctx) as kumo:
        made = kumo.admin.capacity_guarantees.update(
            project, min_gpus=min_gpus, gpu_model=gpu_model, min_vcpus=min_vcpus
        )
    output.note(
        f"Project {made.project} is guaranteed {made.min_gpus} {made.gpu_model} GPUs"
        f" and {made.min_vcpus} vCPUs."
    )


@command(app, "leases")
def lease_calendar(
    ctx: typer.Context,
    days: Annotated[int, typer.Option(help="How many days ahead to show.")] = 30,
    json: Json = False,
) -> None:
    """The fleet's calendar: every project's leases that overlap the next DAYS days."""
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    with connect(ctx) as kumo:
        found = list(
            kumo.admin.leases.list(
                ends_after=now.isoformat(), starts_before=(now + timedelta(days=days)).isoformat()
            )
        )
    show(
        found,
        json,
        ["ID", "PROJECT", "NAME", "GPUS", "STARTS", "ENDS", "STATE"],
        lambda x: [
            x.id,
            x.project,
            x.name,
            f"{x.gpus} x {x.gpu_model}",
            f"{x.starts_at:%Y-%m-%d %H:%M}",
            f"{x.ends_at:%Y-%m-%d %H:%M}",
            x.state,
        ],
    )


@command(app, "lease-update")
def lease_update(
    ctx: typer.Context,
    lease_id: Annotated[int, typer.Argument(help="The lease's ID (`kumo admin leases`).")],
    lend_idle: LendIdle = None,
    start: Start = None,
    ends: Ends = None,
    extend: Extend = None,
    gpus: Gpus = None,
    json: Json = False,
) -> None:
    """Change any project's lease: whether it lends its idle GPUs to spot VMs, when it
    starts (before it holds GPUs) and ends, how many GPUs it holds."""
    with connect(ctx) as kumo:
        relative = start is not None or extend is not None
        now = kumo.admin.leases.get(lease_id) if relative else None
        fields = changes_said(lend_idle, start, ends, extend, gpus, now)
        done = kumo.admin.leases.update(lease_id, **fields)
    return lease_changed(done, f"{done.project}/{done.name}", fields, json)


ISSUER_HELP = (
    "The institution's IdP entity ID or OIDC issuer, e.g. "
    "https://idp.example.ac.jp/idp/shibboleth (not its name)."
)


@command(reviewer_app, "list")
def reviewer_list(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="Only this user's designations.")] = None,
    issuer: Annotated[str | None, typer.Option(help="Only this institution's reviewers.")] = None,
    json: Json = False,
) -> None:
    """Institutional reviewers and the issuer each reviews for."""
    with connect(ctx) as kumo:
        rows = list(kumo.admin.institution_reviewers.list(user=user, issuer=issuer))
    show(
        rows,
        json,
        ["ID", "USER", "ISSUER", "BY", "SINCE"],
        lambda r: [r.id, r.user, r.issuer, r.created_by, r.created_at],
    )


@command(reviewer_app, "add")
def reviewer_add(
    ctx: typer.Context,
    username: str,
    issuer: Annotated[str, typer.Argument(help=ISSUER_HELP)],
) -> None:
    """Let USERNAME review the applications of people who log in at ISSUER."""
    with connect(ctx) as kumo:
        row = kumo.admin.institution_reviewers.create(username, issuer)
    output.note(f"{row.user} reviews applications of people of {row.issuer}.")


@command(reviewer_app, "remove")
def reviewer_remove(
    ctx: typer.Context,
    username: str,
    issuer: Annotated[str, typer.Argument(help=ISSUER_HELP)],
) -> None:
    """End USERNAME's reviewing for ISSUER (decisions made stay)."""
    with connect(ctx) as kumo:
        row = kumo.admin.institution_reviewers.remove(username, issuer)
    output.note(f"{row.user} no longer reviews for {row.issuer}.")
