"""`kumo vm`: the project's virtual machines."""

from pathlib import Path
from typing import Annotated, Any

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import (
    CliError,
    Json,
    Timeout,
    Wait,
    command,
    connect,
    current_project,
    group,
    progress,
)
from kumo_sdk.client import Client
from kumo_sdk.errors import NotFound
from kumo_sdk.types import Operation, VirtualMachine

app = group("The project's virtual machines.")


def _image_id(kumo: Client, image: str) -> int:
    if image.isdigit():
        return int(image)
    ids = [i.id for i in kumo.images.list() if i.name == image and i.state == "active"]
    if not ids:
        raise NotFound(404, "not_found", f"no image named {image!r} for project {kumo.project}")
    if len(ids) > 1:
        raise CliError(f"{len(ids)} images are named {image!r} (ids {ids}): give the id")
    return ids[0]


def _vm_rows(vms: list[VirtualMachine]) -> None:
    output.table(
        ["NAME", "ID", "STATE", "TEMPLATE", "PRIORITY", "HOST", "ADDRESSES"],
        [
            [
                vm.name,
                vm.id,
                vm.state + (f" ({vm.task_state})" if vm.task_state else ""),
                vm.template,
                vm.priority,
                vm.host,
                [ip for nic in vm.nics for ip in nic.fixed_ips],
            ]
            for vm in vms
        ],
    )


def _vm_details(vm: VirtualMachine) -> None:
    output.fields(
        [
            ("name", vm.name),
            ("id", vm.id),
            ("state", vm.state),
            ("task", vm.task_state),
            ("power", vm.power_state),
            ("reason", vm.state_reason),
            ("template", vm.template),
            ("image", vm.image),
            ("priority", vm.priority),
            ("size", f"{vm.vcpus} vCPUs, {vm.memory_mib // 1024} GiB, {vm.disk_gib} GiB disk"),
            ("gpus", f"{vm.gpus} x {vm.gpu_model}" if vm.gpus else 0),
            ("host", vm.host),
            *[
                (f"nic {i}", f"{nic.network} {nic.mac} {', '.join(nic.fixed_ips)}")
                for i, nic in enumerate(vm.nics)
            ],
            ("placement group", vm.placement_group),
            ("lease", vm.lease),
            ("eviction deadline", vm.eviction_deadline),
            ("evicted", vm.evicted_at),
            (
                "reclaim",
                f"{vm.reclaim_action} ({vm.reclaim_reason}) at {vm.reclaim_at:%Y-%m-%d %H:%M:%S}"
                if vm.reclaim_at
                else None,
            ),
            ("created", vm.created_at),
            ("launched", vm.launched_at),
            ("running since", vm.running_since),
            ("checkpointed", vm.checkpointed_at),
            (
                "checkpoints every",
                f"{vm.checkpoint_interval_s:.0f} s" if vm.checkpoint_interval_s else None,
            ),
        ]
    )


@command(app, "create")
def vm_create(
    ctx: typer.Context,
    name: str,
    template: Annotated[str, typer.Option(help="Template name (kumo template list).")],
    image: Annotated[str, typer.Option(help="Image id or name (kumo image list).")],
    spot: Annotated[bool, typer.Option("--spot", help="Run on spot capacity.")] = False,
    network: Annotated[
        list[str] | None,
        typer.Option(metavar="NETWORK", help="A NIC on this network; repeat for more."),
    ] = None,
    ssh_key: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY", help="Name of your SSH key to install; repeatable."),
    ] = None,
    placement_group: Annotated[
        str | None, typer.Option(help="Join this placement group (kumo placement-group list).")
    ] = None,
    lease: Annotated[
        str | None, typer.Option(help="Run in this lease, on its GPUs (kumo lease list).")
    ] = None,
    user_data: Annotated[
        Path | None, typer.Option(help="A cloud-init user-data file.", exists=True)
    ] = None,
    wait: Wait = False,
    timeout: Timeout = 600.0,
    json: Json = False,
) -> None:
    """Create a VM. With --wait, show its progress until it runs."""
    with connect(ctx) as kumo:
        project = current_project(kumo)
        options: dict[str, Any] = {
            "template": template,
            "image": _image_id(kumo, image),
            "spot": spot,
            "networks": network,
            "ssh_keys": ssh_key,
            "placement_group": placement_group,
            "lease": lease,
            "user_data": user_data.read_text(encoding="utf-8") if user_data else "",
        }
        if not wait:
            vm = kumo.vms.create(name, **options)
        else:
            with progress(f"vm {name}") as show:

                def on_poll(operation: Operation) -> None:
                    now = kumo.vms.get(operation.target_id)
                    show(now.state + (f" on {now.host}" if now.host else ""))

                vm = kumo.vms.create(name, **options, wait=True, timeout=timeout, on_poll=on_poll)
    if json:
        return output.emit_json(vm.raw)
    output.note(f"VM {vm.name} is {vm.state} in project {project}.")
    _vm_details(vm)


@command(app, "list")
def vm_list(
    ctx: typer.Context,
    state: Annotated[list[str] | None, typer.Option(help="Only VMs in this state.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Also deleted VMs.")] = False,
    json: Json = False,
) -> None:
    """The project's VMs (deleted ones with --all)."""
    with connect(ctx) as kumo:
        filters = {"state": state} if state else {}
        vms = [
            vm
            for vm in kumo.vms.list(project=current_project(kumo), **filters)
            if all_ or state or vm.state != "deleted"
        ]
    if json:
        return output.emit_json([vm.raw for vm in vms])
    _vm_rows(vms)


@command(app, "show")
def vm_show(
    ctx: typer.Context, vm: Annotated[str, typer.Argument(help="Name or id.")], json: Json = False
) -> None:
    """One VM."""
    with connect(ctx) as kumo:
        found = kumo.vms.find(vm, project=current_project(kumo))
    if json:
        return output.emit_json(found.raw)
    _vm_details(found)


def _vm_action(ctx: typer.Context, vm: str, action: str, wait: bool, timeout: float) -> None:
    with connect(ctx) as kumo:
        found = kumo.vms.find(vm, project=current_project(kumo))
        act = getattr(kumo.vms, action)
        if not wait:
            operation = act(found.id)
            output.note(f"{action} of VM {found.name} accepted: operation {operation.id}.")
            return
        with progress(f"{action} vm {found.name}") as show:
            operation = act(found.id, wait=True, timeout=timeout, on_poll=lambda op: show(op.state))
        output.note(f"{action} of VM {found.name}: {operation.state}.")


VmArg = Annotated[str, typer.Argument(help="The VM's name or id.")]


ACTIONS = (
    ("start", "start", "Start a stopped VM."),
    ("stop", "stop", "Stop a running VM (its resources stay claimed)."),
    ("shelve", "shelve", "Shelve a VM: stop it, keep its disk, release its GPUs, vCPUs, memory."),
    ("unshelve", "unshelve", "Unshelve a VM: place it again where it fits and boot its kept disk."),
    ("reboot", "reboot", "Reboot a running VM."),
    ("reset", "reset", "Hard-reset a running VM (the reset button: its OS is not asked)."),
    ("power-off", "power_off", "Power a running VM off at once (its OS is not asked)."),
)  # fmt: skip


def _action_command(name: str, method: str, doc: str) -> None:
    """``kumo vm <name> VM [--wait] [--timeout S]``: the SDK's ``vms.<method>``."""

    def run(ctx: typer.Context, vm: VmArg, wait: Wait = False, timeout: Timeout = 600) -> None:
        _vm_action(ctx, vm, method, wait, timeout)

    run.__name__ = run.__qualname__ = f"vm_{method}"
    run.__doc__ = doc
    command(app, name)(run)


for _name, _method, _doc in ACTIONS:
    _action_command(_name, _method, _doc)


@command(app, "console-log")
def vm_console_log(
    ctx: typer.Context,
    vm: VmArg,
    lines: Annotated[int | None, typer.Option(help="Only the last LINES lines.")] = None,
) -> None:
    """What the guest printed on its serial console (the last 64 KiB)."""
    with connect(ctx) as kumo:
        found = kumo.vms.find(vm, project=current_project(kumo))
        text = kumo.vms.console_log(found.id, project=current_project(kumo), lines=lines)
    typer.echo(text, nl=not text.endswith("\n"))


@command(app, "console")
def vm_console(ctx: typer.Context, vm: VmArg) -> None:
    """The URL of a running VM's interactive serial console (a websocket, with a token that
    connects once within a minute). Open the VM's Console page in the portal for a terminal,
    or give the URL to a websocket client (binary frames, raw bytes both ways)."""
    with connect(ctx) as kumo:
        found = kumo.vms.find(vm, project=current_project(kumo))
        ticket = kumo.vms.console(found.id, project=current_project(kumo))
    typer.echo(ticket.url)
    typer.echo(f"expires {ticket.expires_at.isoformat() if ticket.expires_at else ''}", err=True)


@command(app, "delete")
def vm_delete(ctx: typer.Context, vm: VmArg, wait: Wait = False, timeout: Timeout = 600) -> None:
    """Delete a VM and its NICs."""
    _vm_action(ctx, vm, "delete", wait, timeout)
