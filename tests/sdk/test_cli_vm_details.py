"""``kumo vm show``'s lines for what a spot VM's guest reported: its last checkpoint and the
interval before it, when Kumo expects the next."""

import re
from datetime import UTC, datetime

from kumo_sdk.cli.vm import _vm_details
from kumo_sdk.types.compute import VirtualMachine


def _shown(capsys, **fields) -> dict[str, str]:
    _vm_details(VirtualMachine(id="1", name="train", state="running", priority="spot", **fields))
    lines = capsys.readouterr().out.splitlines()
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in lines if line.strip())


def test_a_reported_checkpoint_shows_with_the_interval_before_it(capsys):
    saved = datetime(2031, 1, 1, 12, 30, tzinfo=UTC)
    shown = _shown(capsys, checkpointed_at=saved, checkpoint_interval_s=1800.4)
    assert shown["checkpointed"] == "2031-01-01 12:30:00"
    assert shown["checkpoints every"] == "1800 s"


def test_no_checkpoint_reported_shows_dashes(capsys):
    shown = _shown(capsys)
    assert shown["checkpointed"] == "-" and shown["checkpoints every"] == "-"
