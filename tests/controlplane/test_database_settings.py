"""The database settings ``DATABASE_URL`` and ``KUMO_DATABASE_PREPARED`` make."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _database(tmp_path, **env) -> dict:
    """The default database's settings as ``controlplane.settings`` makes them under
    ``env``."""
    script = (
        "import json, controlplane.settings as s; "
        "print(json.dumps(s.DATABASES['default'], default=str))"
    )
    environment = {k: v for k, v in os.environ.items() if k != "KUMO_DATABASE_PREPARED"}
    environment |= {"KUMO_VAR_DIR": str(tmp_path), **env}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _options(tmp_path, **env) -> dict:
    return _database(tmp_path, **env).get("OPTIONS", {})


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


def test_the_options_of_database_url_are_kept(tmp_path):
    url = "postgres://kumo@db.example:5432/kumo?sslmode=verify-full&application_name=kumo"
    database = _database(tmp_path, DATABASE_URL=url)
    assert database["ENGINE"] == "controlplane.postgresql"
    assert database["OPTIONS"] == {
        "sslmode": "verify-full",
        "application_name": "kumo",
        "server_side_binding": True,
        "prepare_threshold": 5,
    }
    off = _database(tmp_path, DATABASE_URL=url, KUMO_DATABASE_PREPARED="0")
    assert off["ENGINE"] == "django.db.backends.postgresql"
    assert off["OPTIONS"] == {"sslmode": "verify-full", "application_name": "kumo"}


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_statement_of_more_values_than_postgresql_binds_runs_with_them_in_its_text():
    """PostgreSQL binds at most 65,535 values to one statement; such a statement (a large
    ``bulk_create``, a long ``__in`` list) is sent with its values in its text."""

    from controlplane.models import AuditEvent
    from controlplane.postgresql.base import MAX_PARAMS

    fields = len([f for f in AuditEvent._meta.concrete_fields if not f.primary_key])
    rows = MAX_PARAMS // fields + 10
    created = AuditEvent.objects.bulk_create(
        AuditEvent(action="a.bulk", object_id=str(i)) for i in range(rows)
    )
    assert AuditEvent.objects.filter(action="a.bulk").count() == rows
    ids = [event.pk for event in created] + list(range(-MAX_PARAMS, 0))
    assert AuditEvent.objects.filter(pk__in=ids).count() == rows


def test_sqlite_is_not_asked_to_prepare(tmp_path):
    options = _options(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'kumo.sqlite3'}")
    assert "server_side_binding" not in options and "transaction_mode" in options
