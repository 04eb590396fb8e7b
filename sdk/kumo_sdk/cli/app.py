"""``kumo``: the command line of Kumo, over the SDK.

Every command reads the server, token and project that ``kumo login`` and ``kumo project
use`` saved (``kumo_sdk.cli.config``); ``--project``/``-p`` or ``$KUMO_PROJECT`` overrides the
project for one command. Lists print a table, or with ``--json`` the API's own JSON. An
error prints its message (and for invalid input the reason per field) on standard error
and exits with status 1.
"""

import functools
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from kumo_sdk.cli import output
from kumo_sdk.cli.config import Config, ConfigError, config_path
from kumo_sdk.client import Client, mint_token
from kumo_sdk.errors import ApiError, KumoError, NotFound
from kumo_sdk.types import Operation, SecurityGroupRule, VirtualMachine, Volume

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    help="Kumo research cloud: VMs, networks, addresses, storage and billing from the command"
    " line.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _group(name: str, help: str) -> typer.Typer:
    group = typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(group, name=name)
    return group


token_app = _group("token", "Your API tokens.")
project_app = _group("project", "Your projects, and which one commands act on.")
template_app = _group("template", "VM sizes on offer.")
image_app = _group("image", "Images the project may boot.")
vm_app = _group("vm", "The project's virtual machines.")
network_app = _group("network", "The project's networks.")
sg_app = _group("security-group", "Security groups (firewall allow-lists) and their rules.")
gip_app = _group("global-ip", "Global IP addresses: 1:1 NAT to a port, or port forwards.")
pf_app = _group("port-forward", "DNAT port forwards from a global IP to a port.")
volume_app = _group("volume", "The project's block volumes.")
bucket_app = _group("bucket", "The project's S3 buckets.")
key_app = _group("access-key", "The project's S3 access keys.")
invoice_app = _group("invoice", "The project's monthly invoices.")

Json = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of a table.")]
Wait = Annotated[bool, typer.Option("--wait", help="Wait until the operation finishes.")]
Timeout = Annotated[float, typer.Option(help="Seconds to wait at most, with --wait.")]


class CliError(Exception):
    """A mistake the CLI itself detects (not logged in, an ambiguous name)."""


@dataclass
class State:
    project: str | None


@app.callback()
def root(
    ctx: typer.Context,
    project: Annotated[
        str | None,
        typer.Option("--project", "-p", envvar="KUMO_PROJECT", help="Project for this command."),
    ] = None,
) -> None:
    ctx.obj = State(project=project)


def command(group: typer.Typer, name: str | None = None) -> Callable[[F], F]:
    """Register a command whose SDK errors become a message and exit status 1."""

    def register(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (KumoError, CliError, ConfigError) as exc:
                _report(exc)
                raise typer.Exit(1) from exc

        group.command(name)(run)
        return fn

    return register


def _report(exc: Exception) -> None:
    if isinstance(exc, ApiError):
        output.note(f"error: {exc.message} ({exc.status} {exc.code})", style="red")
        for field, reasons in exc.details.items():
            text = ", ".join(map(str, reasons)) if isinstance(reasons, list) else str(reasons)
            if f"{field}: {text}" != exc.message:  # not when the message says just that
                output.note(f"  {field}: {text}", style="red")
    else:
        output.note(f"error: {exc}", style="red")


def _client(ctx: typer.Context) -> Client:
    config = Config.load()
    if not config.url or not config.token:
        raise CliError(f"not logged in ({config_path()} has no token): run `kumo login URL`")
    return Client(config.url, config.token, project=ctx.obj.project or config.project)


def _project(kumo: Client) -> str:
    if not kumo.project:
        raise CliError("no project chosen: run `kumo project use SLUG` or pass --project")
    return kumo.project


@contextmanager
def _progress(label: str) -> Iterator[Callable[[str], None]]:
    """A spinner on standard error with the elapsed time; the caller reports each state."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=output.err,
    ) as bar:
        task = bar.add_task(label)
        yield lambda state: bar.update(task, description=f"{label}: {state}")


# --- login and tokens -------------------------------------------------------------------------


@command(app)
def login(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8000")],
    username: Annotated[str, typer.Option(prompt=True)],
    password: Annotated[str, typer.Option(prompt=True, hide_input=True, envvar="KUMO_PASSWORD")],
    token_name: Annotated[
        str | None, typer.Option(help="Name of the token to make (default: kumo-cli@HOST).")
    ] = None,
) -> None:
    """Log in with your password once and save a new API token for every later command."""
    token = mint_token(
        url, username, password, name=token_name or f"kumo-cli@{socket.gethostname()}"
    )
    try:
        previous = Config.load()
    except ConfigError:  # a broken file is replaced by this login
        previous = Config()
    config = Config(url=url.rstrip("/"), token=token.token or "", token_id=token.id)
    with Client(config.url, config.token) as kumo:
        config.username = kumo.whoami().username
        config.project = ctx.obj.project
        if config.project:
            kumo.projects.get(config.project)  # NotFound unless you hold a role in it
        elif (previous.url, previous.username) == (config.url, config.username):
            config.project = previous.project
        else:
            projects = list(kumo.projects.list())
            if len(projects) == 1:
                config.project = projects[0].slug
    path = config.save()
    output.note(f"Logged in to {config.url} as {config.username}.")
    output.note(f"API token {token.name} ({token.prefix}…, id {token.id}) saved in {path}.")
    output.note(
        f"Project: {config.project}."
        if config.project
        else "No project chosen yet: kumo project list, then kumo project use SLUG."
    )


@command(token_app, "list")
def token_list(ctx: typer.Context, json: Json = False) -> None:
    """Your tokens; * marks the one this CLI uses."""
    with _client(ctx) as kumo:
        tokens = list(kumo.tokens.list())
    if json:
        return output.emit_json([t.raw for t in tokens])
    current = Config.load().token_id
    output.table(
        ["", "ID", "NAME", "PREFIX", "PROJECT", "EXPIRES", "LAST USED", "REVOKED"],
        [
            [
                "*" if t.id == current else "",
                t.id,
                t.name,
                t.prefix,
                t.project,
                t.expires_at,
                t.last_used_at,
                t.revoked_at,
            ]
            for t in tokens
        ],
    )


@command(token_app, "create")
def token_create(
    ctx: typer.Context,
    name: str,
    project: Annotated[
        str | None, typer.Option("--scope", help="Scope the token to this project only.")
    ] = None,
    expires_at: Annotated[
        datetime | None, typer.Option(help="When it stops working (ISO 8601).")
    ] = None,
    json: Json = False,
) -> None:
    """Make a token (for a script or another machine); its secret is shown this once."""
    with _client(ctx) as kumo:
        token = kumo.tokens.create(name, project=project, expires_at=expires_at)
    if json:
        return output.emit_json(token.raw)
    output.note(f"Token {token.name} (id {token.id}); the secret is shown only now:")
    output.out.print(token.token, markup=False)


@command(token_app, "revoke")
def token_revoke(ctx: typer.Context, token_id: int) -> None:
    """Revoke a token: it stops working at once and stays listed as revoked."""
    with _client(ctx) as kumo:
        kumo.tokens.revoke(token_id)
    output.note(f"Token {token_id} revoked.")


# --- projects, templates, images --------------------------------------------------------------


@command(project_app, "list")
def project_list(ctx: typer.Context, json: Json = False) -> None:
    """Projects you hold a role in; * marks the one commands act on."""
    with _client(ctx) as kumo:
        projects = list(kumo.projects.list())
        current = kumo.project
    if json:
        return output.emit_json([p.raw for p in projects])
    output.table(
        ["", "SLUG", "NAME", "ROLE", "STATUS", "VALID UNTIL"],
        [
            ["*" if p.slug == current else "", p.slug, p.name, p.my_role, p.status, p.valid_until]
            for p in projects
        ],
    )


@command(project_app, "use")
def project_use(ctx: typer.Context, slug: str) -> None:
    """Act on project SLUG from now on."""
    with _client(ctx) as kumo:
        project = kumo.projects.get(slug)
    config = Config.load()
    config.project = project.slug
    config.save()
    output.note(f"Now using project {project.slug} ({project.name}) as {project.my_role}.")


@command(template_app, "list")
def template_list(ctx: typer.Context, json: Json = False) -> None:
    """Templates (VM sizes) on offer."""
    with _client(ctx) as kumo:
        templates = list(kumo.templates.list())
    if json:
        return output.emit_json([t.raw for t in templates])
    output.table(
        ["NAME", "VCPUS", "MEMORY GIB", "GPUS", "DISK GIB", "SPOT", "DESCRIPTION"],
        [
            [
                t.name,
                t.vcpus,
                t.memory_gib,
                f"{t.gpus} x {t.gpu_model}" if t.gpus else 0,
                t.disk_gib,
                t.spot_allowed,
                t.description,
            ]
            for t in templates
        ],
    )


@command(image_app, "list")
def image_list(ctx: typer.Context, json: Json = False) -> None:
    """Images the project may boot: public ones and its own."""
    with _client(ctx) as kumo:
        images = list(kumo.images.list(project=_project(kumo)))
    if json:
        return output.emit_json([i.raw for i in images])
    output.table(
        ["ID", "NAME", "DISTRO", "VERSION", "FORMAT", "MIN DISK GIB", "VISIBILITY"],
        [
            [i.id, i.name, i.os_distro, i.os_version, i.format, i.min_disk_gib, i.visibility]
            for i in images
        ],
    )


# --- VMs --------------------------------------------------------------------------------------


def _image_id(kumo: Client, image: str) -> int:
    if image.isdigit():
        return int(image)
    ids = [i.id for i in kumo.images.list() if i.name == image and i.active]
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
            ("created", vm.created_at),
            ("launched", vm.launched_at),
        ]
    )


@command(vm_app, "create")
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
    user_data: Annotated[
        Path | None, typer.Option(help="A cloud-init user-data file.", exists=True)
    ] = None,
    wait: Wait = False,
    timeout: Timeout = 600.0,
    json: Json = False,
) -> None:
    """Create a VM. With --wait, show its progress until it runs."""
    with _client(ctx) as kumo:
        project = _project(kumo)
        options: dict[str, Any] = {
            "template": template,
            "image": _image_id(kumo, image),
            "spot": spot,
            "networks": network,
            "ssh_keys": ssh_key,
            "user_data": user_data.read_text(encoding="utf-8") if user_data else "",
        }
        if not wait:
            vm = kumo.vms.create(name, **options)
        else:
            with _progress(f"vm {name}") as show:

                def on_poll(operation: Operation) -> None:
                    now = kumo.vms.get(operation.target_id)
                    show(now.state + (f" on {now.host}" if now.host else ""))

                vm = kumo.vms.create(name, **options, wait=True, timeout=timeout, on_poll=on_poll)
    if json:
        return output.emit_json(vm.raw)
    output.note(f"VM {vm.name} is {vm.state} in project {project}.")
    _vm_details(vm)


@command(vm_app, "list")
def vm_list(
    ctx: typer.Context,
    state: Annotated[list[str] | None, typer.Option(help="Only VMs in this state.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Also deleted VMs.")] = False,
    json: Json = False,
) -> None:
    """The project's VMs (deleted ones with --all)."""
    with _client(ctx) as kumo:
        filters = {"state": state} if state else {}
        vms = [
            vm
            for vm in kumo.vms.list(project=_project(kumo), **filters)
            if all_ or state or vm.state != "deleted"
        ]
    if json:
        return output.emit_json([vm.raw for vm in vms])
    _vm_rows(vms)


@command(vm_app, "show")
def vm_show(
    ctx: typer.Context, vm: Annotated[str, typer.Argument(help="Name or id.")], json: Json = False
) -> None:
    """One VM."""
    with _client(ctx) as kumo:
        found = kumo.vms.find(vm, project=_project(kumo))
    if json:
        return output.emit_json(found.raw)
    _vm_details(found)


def _vm_action(ctx: typer.Context, vm: str, action: str, wait: bool, timeout: float) -> None:
    with _client(ctx) as kumo:
        found = kumo.vms.find(vm, project=_project(kumo))
        act = getattr(kumo.vms, action)
        if not wait:
            operation = act(found.id)
            output.note(f"{action} of VM {found.name} accepted: operation {operation.id}.")
            return
        with _progress(f"{action} vm {found.name}") as show:
            operation = act(found.id, wait=True, timeout=timeout, on_poll=lambda op: show(op.state))
        output.note(f"{action} of VM {found.name}: {operation.state}.")


VmArg = Annotated[str, typer.Argument(help="The VM's name or id.")]


@command(vm_app, "start")
def vm_start(ctx: typer.Context, vm: VmArg, wait: Wait = False, timeout: Timeout = 600) -> None:
    """Start a stopped VM."""
    _vm_action(ctx, vm, "start", wait, timeout)


@command(vm_app, "stop")
def vm_stop(ctx: typer.Context, vm: VmArg, wait: Wait = False, timeout: Timeout = 600) -> None:
    """Stop a running VM (its resources stay claimed)."""
    _vm_action(ctx, vm, "stop", wait, timeout)


@command(vm_app, "reboot")
def vm_reboot(ctx: typer.Context, vm: VmArg, wait: Wait = False, timeout: Timeout = 600) -> None:
    """Reboot a running VM."""
    _vm_action(ctx, vm, "reboot", wait, timeout)


@command(vm_app, "delete")
def vm_delete(ctx: typer.Context, vm: VmArg, wait: Wait = False, timeout: Timeout = 600) -> None:
    """Delete a VM and its NICs."""
    _vm_action(ctx, vm, "delete", wait, timeout)


# --- networks and security groups -------------------------------------------------------------


@command(network_app, "list")
def network_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's networks and their subnets."""
    with _client(ctx) as kumo:
        project = _project(kumo)
        networks = list(kumo.networks.list(project=project))
        cidrs: dict[str, list[str]] = {}
        if not json:
            for subnet in kumo.subnets.list(project=project):
                cidrs.setdefault(subnet.network, []).append(subnet.cidr)
    if json:
        return output.emit_json([n.raw for n in networks])
    output.table(
        ["NAME", "ID", "KIND", "VNI", "MTU", "SUBNETS", "EXTERNAL"],
        [
            [n.name, n.id, n.kind, n.vni, n.mtu, cidrs.get(n.name, []), n.external_access]
            for n in networks
        ],
    )


@command(network_app, "create")
def network_create(
    ctx: typer.Context,
    name: str,
    cidr: Annotated[str, typer.Option(help="A first subnet, e.g. 10.0.0.0/24.")] = "",
    external_access: Annotated[
        bool, typer.Option("--external-access", help="SNAT to the outside via the router.")
    ] = False,
    description: str = "",
    json: Json = False,
) -> None:
    """Create a network (an isolated VXLAN segment)."""
    with _client(ctx) as kumo:
        network = kumo.networks.create(
            name,
            project=_project(kumo),
            cidr=cidr,
            external_access=external_access,
            description=description,
        )
    if json:
        return output.emit_json(network.raw)
    output.note(f"Network {network.name} created: VNI {network.vni}, MTU {network.mtu}.")


@command(network_app, "delete")
def network_delete(
    ctx: typer.Context, network: Annotated[str, typer.Argument(help="Name or id.")]
) -> None:
    """Delete a network without ports."""
    with _client(ctx) as kumo:
        found = kumo.networks.find(network, project=_project(kumo))
        kumo.networks.delete(found.id)
    output.note(f"Network {found.name} deleted.")


def _rule_text(rule: SecurityGroupRule) -> str:
    ports = ""
    if rule.port_min is not None:
        ports = f" {rule.port_min}" + (
            f"-{rule.port_max}" if rule.port_max not in (None, rule.port_min) else ""
        )
    peer = rule.remote_cidr or (f"group {rule.remote_group}" if rule.remote_group else "any")
    side = "from" if rule.direction == "ingress" else "to"
    return f"#{rule.id} {rule.direction} {rule.protocol}{ports} {side} {peer}"


@command(sg_app, "list")
def sg_list(ctx: typer.Context, json: Json = False) -> None:
    """Security groups with their rules."""
    with _client(ctx) as kumo:
        groups = list(kumo.security_groups.list(project=_project(kumo)))
    if json:
        return output.emit_json([g.raw for g in groups])
    output.table(
        ["ID", "NAME", "RULES", "DESCRIPTION"],
        [[g.id, g.name, "\n".join(map(_rule_text, g.rules)), g.description] for g in groups],
    )


@command(sg_app, "create")
def sg_create(ctx: typer.Context, name: str, description: str = "", json: Json = False) -> None:
    """Create a security group (no rules: it allows nothing until you add some)."""
    with _client(ctx) as kumo:
        group = kumo.security_groups.create(name, project=_project(kumo), description=description)
    if json:
        return output.emit_json(group.raw)
    output.note(f"Security group {group.name} created (id {group.id}).")


@command(sg_app, "rule-add")
def sg_rule_add(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="The security group's name.")],
    direction: Annotated[str, typer.Option(help="ingress or egress.")] = "ingress",
    protocol: Annotated[str, typer.Option(help="any, tcp, udp or icmp.")] = "any",
    port: Annotated[str | None, typer.Option(help="A port or a range: 22 or 8000-8100.")] = None,
    remote_cidr: Annotated[str, typer.Option(help="Peers in this CIDR.")] = "",
    remote_group: Annotated[str | None, typer.Option(help="Peers in this group.")] = None,
    description: str = "",
    json: Json = False,
) -> None:
    """Allow a flow: add a rule to a security group."""
    port_min = port_max = None
    if port:
        low, _, high = port.partition("-")
        if not (low.isdigit() and (not high or high.isdigit())):
            raise typer.BadParameter(f"{port!r} is not a port or a range", param_hint="--port")
        port_min, port_max = int(low), int(high or low)
    with _client(ctx) as kumo:
        rule = kumo.security_groups.add_rule(
            group,
            project=_project(kumo),
            direction=direction,
            protocol=protocol,
            port_min=port_min,
            port_max=port_max,
            remote_cidr=remote_cidr,
            remote_group=remote_group,
            description=description,
        )
    if json:
        return output.emit_json(rule.raw)
    output.note(f"Rule added to {rule.group}: {_rule_text(rule)}.")


@command(sg_app, "rule-delete")
def sg_rule_delete(ctx: typer.Context, rule_id: int) -> None:
    """Delete a rule by id (kumo security-group list shows them as #ID)."""
    with _client(ctx) as kumo:
        kumo.security_groups.delete_rule(rule_id, project=_project(kumo))
    output.note(f"Rule {rule_id} deleted.")


# --- global IPs and port forwards -------------------------------------------------------------

PortOpt = Annotated[str | None, typer.Option("--port", help="A port id.")]
VmOpt = Annotated[str | None, typer.Option("--vm", help="A VM's name or id: its first NIC.")]


def _target_port(kumo: Client, port: str | None, vm: str | None) -> str:
    if port is not None and vm is None:
        return port
    if vm is not None and port is None:
        found = kumo.vms.find(vm)
        if not found.nics:
            raise CliError(f"VM {found.name} has no NIC")
        return found.nics[0].port
    raise CliError("give exactly one of --port and --vm")


@command(gip_app, "list")
def gip_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's global IPs (the router's own is marked)."""
    with _client(ctx) as kumo:
        addresses = list(kumo.global_ips.list(project=_project(kumo)))
    if json:
        return output.emit_json([a.raw for a in addresses])
    output.table(
        ["ID", "ADDRESS", "POOL", "PORT", "ROUTER", "DESCRIPTION"],
        [[a.id, a.address, a.pool, a.port, a.router, a.description] for a in addresses],
    )


@command(gip_app, "allocate")
def gip_allocate(ctx: typer.Context, description: str = "", json: Json = False) -> None:
    """Take a new global IP for the project."""
    with _client(ctx) as kumo:
        address = kumo.global_ips.allocate(project=_project(kumo), description=description)
    if json:
        return output.emit_json(address.raw)
    output.out.print(address.address, markup=False)


@command(gip_app, "release")
def gip_release(ctx: typer.Context, address: str) -> None:
    """Give a global IP back (its port forwards go with it)."""
    with _client(ctx) as kumo:
        found = kumo.global_ips.find(address, project=_project(kumo))
        kumo.global_ips.release(found.id)
    output.note(f"{address} released.")


@command(gip_app, "associate")
def gip_associate(
    ctx: typer.Context,
    address: str,
    port: PortOpt = None,
    vm: VmOpt = None,
    none: Annotated[bool, typer.Option("--none", help="Dissociate it.")] = False,
    json: Json = False,
) -> None:
    """1:1 NAT a global IP to a port (--port, or --vm for a VM's first NIC); --none undoes it."""
    with _client(ctx) as kumo:
        found = kumo.global_ips.find(address, project=_project(kumo))
        target = None if none else _target_port(kumo, port, vm)
        updated = kumo.global_ips.associate(found.id, target)
    if json:
        return output.emit_json(updated.raw)
    output.note(
        f"{address} now NATs to port {updated.port}." if updated.port else f"{address} is free."
    )


@command(pf_app, "list")
def pf_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's port forwards."""
    with _client(ctx) as kumo:
        forwards = list(kumo.port_forwards.list(project=_project(kumo)))
    if json:
        return output.emit_json([f.raw for f in forwards])
    output.table(
        ["ID", "GLOBAL IP", "PROTOCOL", "EXTERNAL PORT", "TO PORT", "INTERNAL PORT"],
        [
            [f.id, f.global_ip, f.protocol, f.external_port, f.port, f.internal_port]
            for f in forwards
        ],
    )


@command(pf_app, "create")
def pf_create(
    ctx: typer.Context,
    address: Annotated[str, typer.Argument(help="One of the project's global IPs.")],
    external_port: Annotated[int, typer.Option(help="The port on the global IP.")],
    internal_port: Annotated[int, typer.Option(help="The port on the VM.")],
    protocol: Annotated[str, typer.Option(help="tcp or udp.")] = "tcp",
    port: PortOpt = None,
    vm: VmOpt = None,
    description: str = "",
    json: Json = False,
) -> None:
    """Forward ADDRESS:EXTERNAL_PORT to a port (--port, or --vm for a VM's first NIC)."""
    with _client(ctx) as kumo:
        forward = kumo.port_forwards.create(
            address,
            project=_project(kumo),
            protocol=protocol,
            external_port=external_port,
            port=_target_port(kumo, port, vm),
            internal_port=internal_port,
            description=description,
        )
    if json:
        return output.emit_json(forward.raw)
    output.note(
        f"Forward {forward.id}: {forward.global_ip}:{forward.external_port}/{forward.protocol}"
        f" -> port {forward.port}:{forward.internal_port}."
    )


@command(pf_app, "delete")
def pf_delete(ctx: typer.Context, forward_id: int) -> None:
    """Delete a port forward by id."""
    with _client(ctx) as kumo:
        kumo.port_forwards.delete(forward_id, project=_project(kumo))
    output.note(f"Port forward {forward_id} deleted.")


# --- volumes, buckets and access keys ---------------------------------------------------------

VolumeArg = Annotated[str, typer.Argument(help="The volume's name or id.")]


def _volume_details(volume: Volume) -> None:
    output.fields(
        [
            ("name", volume.name),
            ("id", volume.id),
            ("state", volume.state),
            ("size", f"{volume.size_gib} GiB"),
            ("tier", volume.tier),
            ("vm", volume.vm),
            ("device", volume.device),
            ("guest path", volume.guest_path),
            ("host", volume.host),
            ("description", volume.description),
            ("created", volume.created_at),
        ]
    )


@command(volume_app, "list")
def volume_list(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="available or in_use.")] = None,
    json: Json = False,
) -> None:
    """The project's volumes and what they are attached to."""
    with _client(ctx) as kumo:
        filters = {"state": state} if state else {}
        volumes = list(kumo.volumes.list(project=_project(kumo), **filters))
    if json:
        return output.emit_json([v.raw for v in volumes])
    output.table(
        ["NAME", "ID", "SIZE GIB", "TIER", "STATE", "VM", "DEVICE"],
        [[v.name, v.id, v.size_gib, v.tier, v.state, v.vm, v.device] for v in volumes],
    )


@command(volume_app, "create")
def volume_create(
    ctx: typer.Context,
    name: str,
    size: Annotated[int, typer.Option("--size", help="Size in GiB.")],
    tier: Annotated[
        str | None, typer.Option(help="shared (any host; the default) or local (one host's NVMe).")
    ] = None,
    description: str = "",
    json: Json = False,
) -> None:
    """Create a volume (it counts against the storage quota at once)."""
    with _client(ctx) as kumo:
        volume = kumo.volumes.create(
            name, size_gib=size, project=_project(kumo), tier=tier, description=description
        )
    if json:
        return output.emit_json(volume.raw)
    output.note(
        f"Volume {volume.name} created: {volume.size_gib} GiB {volume.tier} (id {volume.id})."
    )


@command(volume_app, "attach")
def volume_attach(
    ctx: typer.Context,
    volume: VolumeArg,
    vm: Annotated[str, typer.Argument(help="The VM's name or id.")],
    json: Json = False,
) -> None:
    """Attach a volume to a VM as its next free disk (a running guest sees it after a reboot)."""
    with _client(ctx) as kumo:
        project = _project(kumo)
        found = kumo.volumes.find(volume, project=project)
        target = kumo.vms.find(vm, project=project)
        attached = kumo.volumes.attach(found.id, target.id)
    if json:
        return output.emit_json(attached.raw)
    output.note(
        f"Volume {attached.name} attached to VM {target.name} as {attached.device}"
        f" ({attached.guest_path})."
    )


@command(volume_app, "detach")
def volume_detach(ctx: typer.Context, volume: VolumeArg, json: Json = False) -> None:
    """Detach a volume from its VM; its data stays."""
    with _client(ctx) as kumo:
        found = kumo.volumes.find(volume, project=_project(kumo))
        detached = kumo.volumes.detach(found.id)
    if json:
        return output.emit_json(detached.raw)
    output.note(f"Volume {detached.name} detached.")


@command(volume_app, "extend")
def volume_extend(
    ctx: typer.Context,
    volume: VolumeArg,
    size: Annotated[int, typer.Option("--size", help="The new size in GiB.")],
    json: Json = False,
) -> None:
    """Grow a volume to --size GiB."""
    with _client(ctx) as kumo:
        found = kumo.volumes.find(volume, project=_project(kumo))
        extended = kumo.volumes.extend(found.id, size)
    if json:
        return output.emit_json(extended.raw)
    output.note(f"Volume {extended.name} is now {extended.size_gib} GiB.")


@command(volume_app, "delete")
def volume_delete(ctx: typer.Context, volume: VolumeArg) -> None:
    """Delete a detached volume and its data."""
    with _client(ctx) as kumo:
        found = kumo.volumes.find(volume, project=_project(kumo))
        kumo.volumes.delete(found.id)
    output.note(f"Volume {found.name} deleted.")


@command(bucket_app, "list")
def bucket_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's buckets, their quotas and last measured usage."""
    with _client(ctx) as kumo:
        buckets = list(kumo.buckets.list(project=_project(kumo)))
    if json:
        return output.emit_json([b.raw for b in buckets])
    output.table(
        ["NAME", "QUOTA GIB", "USED BYTES", "MEASURED", "ENDPOINT"],
        [[b.name, b.quota_gib, b.used_bytes, b.usage_at, b.endpoint] for b in buckets],
    )


@command(bucket_app, "create")
def bucket_create(
    ctx: typer.Context,
    name: str,
    quota: Annotated[int, typer.Option("--quota", help="Quota in GiB.")],
    json: Json = False,
) -> None:
    """Create a bucket (its name is global across the object store)."""
    with _client(ctx) as kumo:
        bucket = kumo.buckets.create(name, quota_gib=quota, project=_project(kumo))
    if json:
        return output.emit_json(bucket.raw)
    output.note(f"Bucket {bucket.name} created ({bucket.quota_gib} GiB) at {bucket.endpoint}.")


@command(bucket_app, "delete")
def bucket_delete(ctx: typer.Context, name: str) -> None:
    """Delete a bucket and everything in it."""
    with _client(ctx) as kumo:
        kumo.buckets.delete(name, project=_project(kumo))
    output.note(f"Bucket {name} deleted.")


@command(key_app, "list")
def key_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's access keys (their secrets are never shown again)."""
    with _client(ctx) as kumo:
        keys = list(kumo.access_keys.list(project=_project(kumo)))
    if json:
        return output.emit_json([k.raw for k in keys])
    output.table(
        ["ID", "ACCESS KEY ID", "CREATED BY", "CREATED", "DESCRIPTION"],
        [[k.id, k.access_key_id, k.created_by, k.created_at, k.description] for k in keys],
    )


@command(key_app, "create")
def key_create(ctx: typer.Context, description: str = "", json: Json = False) -> None:
    """Make an access key (project admins); its secret is shown this once."""
    with _client(ctx) as kumo:
        key = kumo.access_keys.create(project=_project(kumo), description=description)
    if json:
        return output.emit_json(key.raw)
    output.note(f"Access key {key.access_key_id} (id {key.id}) for {key.endpoint}.")
    output.note("The secret is shown only now:")
    output.out.print(key.secret_access_key, markup=False)


@command(key_app, "delete")
def key_delete(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help="The key's id or access key id.")],
) -> None:
    """Revoke an access key: it stops working at once."""
    with _client(ctx) as kumo:
        project = _project(kumo)
        key_id = int(key) if key.isdigit() else kumo.access_keys.find(key, project=project).id
        kumo.access_keys.delete(key_id, project=project)
    output.note(f"Access key {key} deleted.")


# --- usage and invoices -----------------------------------------------------------------------


@command(app, "usage")
def usage(
    ctx: typer.Context,
    forecast: Annotated[
        bool, typer.Option("--forecast", help="This month's spend so far and projected.")
    ] = False,
    resource: Annotated[
        str | None, typer.Option(help="Only this resource (vcpu, memory, gpu, ...).")
    ] = None,
    open_: Annotated[bool, typer.Option("--open", help="Only intervals still open.")] = False,
    since: Annotated[
        datetime | None, typer.Option(help="Only intervals started at or after this.")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(help="Only intervals started before this.")
    ] = None,
    json: Json = False,
) -> None:
    """The project's usage records, or with --forecast this month's spend and forecast."""
    with _client(ctx) as kumo:
        project = _project(kumo)
        if forecast:
            report = kumo.usage.forecast(project=project)
        else:
            filters: dict[str, Any] = {
                "resource": resource,
                "open": True if open_ else None,
                "started_after": since,
                "started_before": until,
            }
            records = list(kumo.usage.list(project=project, **filters))
    if forecast:
        if json:
            return output.emit_json(report.raw)
        output.fields(
            [
                ("period", f"{report.period_start} to {report.period_end}"),
                ("so far", f"{report.so_far} {report.currency}"),
                ("projected", f"{report.projected} {report.currency}"),
                ("points", report.points_balance),
                *[
                    (
                        f"budget {b.name}",
                        f"{b.amount}: {b.spent_percent} % spent, {b.projected_percent} % projected",
                    )
                    for b in report.budgets
                ],
            ]
        )
        if report.lines:
            output.table(
                ["RESOURCE", "MODEL", "PRIORITY", "QUANTITY", "UNIT", "UNIT PRICE", "AMOUNT"],
                [
                    [
                        li.resource,
                        li.model,
                        li.priority,
                        li.quantity,
                        li.unit,
                        li.unit_price,
                        li.amount,
                    ]
                    for li in report.lines
                ],
            )
        return None
    if json:
        return output.emit_json([r.raw for r in records])
    output.table(
        ["ID", "RESOURCE", "MODEL", "PRIORITY", "QUANTITY", "SUBJECT", "STARTED", "ENDED"],
        [
            [
                r.id,
                r.resource,
                r.model,
                r.priority,
                r.quantity,
                r.subject_name or f"{r.subject_type} {r.subject_id}",
                r.started_at,
                r.ended_at or "open",
            ]
            for r in records
        ],
    )


@command(invoice_app, "list")
def invoice_list(ctx: typer.Context, json: Json = False) -> None:
    """The project's invoices."""
    with _client(ctx) as kumo:
        invoices = list(kumo.invoices.list(project=_project(kumo)))
    if json:
        return output.emit_json([i.raw for i in invoices])
    output.table(
        ["ID", "PERIOD", "CURRENCY", "TOTAL", "POINTS", "DUE", "ISSUED"],
        [
            [
                i.id,
                f"{i.period_start:%Y-%m}",
                i.currency,
                i.total,
                i.points_applied,
                i.amount_due,
                i.issued_at,
            ]
            for i in invoices
        ],
    )


class InvoiceFormat(StrEnum):
    csv = "csv"
    json = "json"


@command(invoice_app, "download")
def invoice_download(
    ctx: typer.Context,
    invoice_id: Annotated[int, typer.Argument(metavar="ID", help="The invoice's id.")],
    format: Annotated[
        InvoiceFormat, typer.Option("--format", help="csv, or json (its canonical document).")
    ] = InvoiceFormat.csv,
    out: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file, not stdout.")
    ] = None,
) -> None:
    """Download an invoice as CSV or JSON, to standard output or a file."""
    with _client(ctx) as kumo:
        body = kumo.invoices.download(invoice_id, format=format.value, project=_project(kumo))
    if out is None:
        typer.echo(body.decode("utf-8"), nl=not body.endswith(b"\n"))
        return
    out.write_bytes(body)
    output.note(f"Invoice {invoice_id} written to {out} ({len(body)} bytes).")


def main() -> None:
    """The ``kumo`` console script."""
    app()
