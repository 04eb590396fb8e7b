"""What every command group shares: the ``command`` decorator (SDK errors become a message
and exit status 1), the client from the saved configuration, the chosen project, a progress
spinner, and the common options."""

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from kumo_sdk.cli import output
from kumo_sdk.cli.config import Config, ConfigError, config_path
from kumo_sdk.client import Client
from kumo_sdk.errors import ApiError, KumoError
from kumo_sdk.resources.operations import Operations
from kumo_sdk.types import Operation

F = TypeVar("F", bound=Callable[..., Any])


def group(help: str) -> typer.Typer:
    """A command group (``kumo vm ...``); the app registers it under its name."""
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=None)


Json = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of a table.")]

Wait = Annotated[bool, typer.Option("--wait", help="Wait until the operation finishes.")]

Timeout = Annotated[float, typer.Option(help="Seconds to wait at most, with --wait.")]


class CliError(Exception):
    """A mistake the CLI itself detects (not logged in, an ambiguous name)."""


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


def connect(ctx: typer.Context) -> Client:
    config = Config.load()
    if not config.url or not config.token:
        raise CliError(f"not logged in ({config_path()} has no token): run `kumo login URL`")
    return Client(config.url, config.token, project=ctx.obj.project or config.project)


def current_project(kumo: Client) -> str:
    if not kumo.project:
        raise CliError("no project chosen: run `kumo project use SLUG` or pass --project")
    return kumo.project


@contextmanager
def progress(label: str) -> Iterator[Callable[[str], None]]:
    """A spinner on standard error with the elapsed time; the caller reports each state."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=output.err,
    ) as bar:
        task = bar.add_task(label)
        yield lambda state: bar.update(task, description=f"{label}: {state}")


def wait_operation(
    operations: Operations,
    operation: Operation | str,
    *,
    label: str,
    timeout: float,
    project: str | None = None,
) -> Operation:
    """Poll ``operation`` through ``operations`` (``kumo.operations``, or
    ``kumo.admin.operations`` for any project's and the hosts') with a spinner showing its
    state until it finishes: the operation once it succeeded; ``OperationFailed`` (holding
    the failed operation) or ``OperationTimeout`` otherwise, which ``command`` reports. An
    id is looked up in ``project``."""
    with progress(label) as report:
        return operations.wait(
            operation, project=project, timeout=timeout, on_poll=lambda o: report(o.state)
        )


PortOpt = Annotated[str | None, typer.Option("--port", help="A port id.")]

VmOpt = Annotated[str | None, typer.Option("--vm", help="A VM's name or id: its first NIC.")]


def target_port(kumo: Client, port: str | None, vm: str | None) -> str:
    if port is not None and vm is None:
        return port
    if vm is not None and port is None:
        found = kumo.vms.find(vm)
        if not found.nics:
            raise CliError(f"VM {found.name} has no NIC")
        return found.nics[0].port
    raise CliError("give exactly one of --port and --vm")


def typed_id(kind: str | None, key: str | None) -> str | None:
    """An object as a table names it: its type and id (``compute.virtualmachine 3f…``)."""
    return " ".join(filter(None, [kind, key])) or None


def show(items: list[Any], json: bool, columns: list[str], row: Callable[[Any], list]) -> None:
    """A list as a table, or with ``--json`` as the API's JSON."""
    if json:
        return output.emit_json([item.raw for item in items])
    output.table(columns, [row(item) for item in items])
    return None
