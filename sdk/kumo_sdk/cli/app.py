"""``kumo``: the command line of Kumo, over the SDK.

Every command reads the server, token and project that ``kumo login`` and ``kumo project
use`` saved (``kumo_sdk.cli.config``); ``--project``/``-p`` or ``$KUMO_PROJECT`` overrides the
project for one command. Lists print a table, or with ``--json`` the API's own JSON. An
error prints its message (and for invalid input the reason per field) on standard error
and exits with status 1. Each command group is a module of its own (``kumo_sdk.cli.vm``
for ``kumo vm ...``), registered below with one line.
"""

import socket
from dataclasses import dataclass
from typing import Annotated

import typer

from kumo_sdk.cli import (
    access_key,
    admin,
    application,
    bucket,
    budget,
    event,
    external_connection,
    global_ip,
    image,
    invitation,
    invoice,
    lease,
    member,
    network,
    operation,
    output,
    placement_group,
    port,
    port_forward,
    project,
    quota,
    security_group,
    share,
    ssh_key,
    subnet,
    template,
    token,
    usage,
    user,
    vm,
    volume,
    webhook,
)
from kumo_sdk.cli.common import command
from kumo_sdk.cli.config import Config, ConfigError
from kumo_sdk.client import Client, mint_token

app = typer.Typer(
    help="Kumo research cloud: VMs, networks, addresses, storage and billing from the command"
    " line.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


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


# One line per command group: its module holds its commands (openstackclient's shape).
# A new group: write kumo_sdk/cli/<group>.py with ``app = group("...")``, add it here.
app.add_typer(token.app, name="token")
app.add_typer(ssh_key.app, name="ssh-key")
app.add_typer(project.app, name="project")
app.add_typer(member.app, name="member")
app.add_typer(invitation.app, name="invitation")
app.add_typer(application.app, name="application")
app.add_typer(user.app, name="user")
command(app, "quota")(quota.quota)
app.add_typer(template.app, name="template")
app.add_typer(image.app, name="image")
app.add_typer(vm.app, name="vm")
app.add_typer(subnet.app, name="subnet")
app.add_typer(placement_group.app, name="placement-group")
app.add_typer(lease.app, name="lease")
app.add_typer(network.app, name="network")
app.add_typer(security_group.app, name="security-group")
app.add_typer(global_ip.app, name="global-ip")
app.add_typer(port.app, name="port")
app.add_typer(port_forward.app, name="port-forward")
app.add_typer(external_connection.app, name="external-connection")
app.add_typer(volume.app, name="volume")
app.add_typer(share.app, name="share")
app.add_typer(bucket.app, name="bucket")
app.add_typer(access_key.app, name="access-key")
app.add_typer(invoice.app, name="invoice")
command(app, "usage")(usage.usage)
app.add_typer(budget.app, name="budget")
command(app, "points")(budget.points)
app.add_typer(webhook.app, name="webhook")
app.add_typer(event.app, name="event")
app.add_typer(operation.app, name="operation")
app.add_typer(admin.app, name="admin")


def main() -> None:
    """The ``kumo`` console script."""
    app()
