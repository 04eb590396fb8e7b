"""The database settings ``DATABASE_URL`` and ``KUMO_DATABASE_PREPARED`` make."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _options(tmp_path, **env) -> dict:
    """The default database's OPTIONS as ``controlplane.settings`` makes them under ``env``."""
    script = (
        "import json, controlplane.settings as s; "
        "print(json.dumps(s.DATABASES['default'].get('OPTIONS', {})))"
    )
    environment = {k: v for k, v in os.environ.items() if k != "KUMO_DATABASE_PREPARED"}
    environment |= {"KUMO_VAR_DIR": str(tmp_path), **env}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("prepared", "expected"),
    [
        (None, {"server_side_binding": True, "prepare_threshold": 5}),
        ("1", {"server_side_binding": True, "prepare_threshold": 5}),
        ("0", {}),
    ],
)
def test_postgresql_keeps_statements_prepared_unless_told_not_to(tmp_path, prepared, expected):
    env = {"DATABASE_URL": "postgres://kumo@db.example:5432/kumo"}
    if prepared is not None:
        env["KUMO_DATABASE_PREPARED"] = prepared
    assert _options(tmp_path, **env) == expected


def test_sqlite_is_not_asked_to_prepare(tmp_path):
    options = _options(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'kumo.sqlite3'}")
    assert "server_side_binding" not in options and "transaction_mode" in options
