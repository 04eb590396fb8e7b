"""`kumo ssh-key`: your SSH public keys (VMs install those named by `vm create --ssh-key`)."""

from pathlib import Path
from typing import Annotated

import typer

from kumo_sdk.cli import output
from kumo_sdk.cli.common import Json, command, connect, group, show

app = group("Your SSH public keys, for `kumo vm create --ssh-key NAME`.")


@command(app, "list")
def ssh_key_list(ctx: typer.Context, json: Json = False) -> None:
    """Your SSH keys."""
    with connect(ctx) as kumo:
        keys = list(kumo.ssh_keys.list())
    show(
        keys,
        json,
        ["ID", "NAME", "TYPE", "BITS", "FINGERPRINT", "COMMENT"],
        lambda k: [k.id, k.name, k.key_type, k.bits, k.fingerprint, k.comment],
    )


@command(app, "add")
def ssh_key_add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The name `vm create --ssh-key` will use.")],
    public_key_file: Annotated[
        Path, typer.Argument(help="The public key file, e.g. ~/.ssh/id_ed25519.pub.", exists=True)
    ],
    json: Json = False,
) -> None:
    """Register an SSH public key (checked: type, size, encoding)."""
    with connect(ctx) as kumo:
        key = kumo.ssh_keys.create(name, public_key_file.read_text(encoding="utf-8").strip())
    if json:
        return output.emit_json(key.raw)
    output.note(f"SSH key {key.name} added: {key.key_type} {key.bits} bits, {key.fingerprint}.")
    return None


@command(app, "delete")
def ssh_key_delete(
    ctx: typer.Context, key: Annotated[str, typer.Argument(help="The key's name or id.")]
) -> None:
    """Delete one of your SSH keys (VMs that have it keep it)."""
    with connect(ctx) as kumo:
        key_id = int(key) if key.isdigit() else kumo.ssh_keys.find(key).id
        kumo.ssh_keys.delete(key_id)
    output.note(f"SSH key {key} deleted.")
