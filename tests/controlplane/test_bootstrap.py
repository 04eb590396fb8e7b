"""`manage.py bootstrap`, which `make run` calls on every start."""

import pytest
from django.core.management import call_command

from controlplane.models import AuditEvent
from tenants.choices import Role
from tenants.models import Membership, Project, User

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def _snapshot():
    return (
        sorted(User.objects.values_list("username", "is_staff")),
        sorted(Project.objects.values_list("slug", "owner__username")),
        sorted(Membership.objects.values_list("project__slug", "user__username", "role")),
        AuditEvent.objects.count(),
    )


def test_bootstrap_creates_admin_demo_project_and_member_once(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("bootstrap", stdout=open("/dev/null", "w"))  # noqa: SIM115
    first = _snapshot()
    assert ("admin", True) in first[0] and ("alice", False) in first[0]
    assert first[2] == [("demo", "admin", Role.OWNER), ("demo", "alice", Role.MEMBER)]

    call_command("bootstrap", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert _snapshot() == first  # nothing duplicated, nothing new in the trail


def test_bootstrap_passwords_are_generated_once_and_work(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("bootstrap", stdout=open("/dev/null", "w"))  # noqa: SIM115
    password = (tmp_path / "admin-password").read_text().strip()
    call_command("bootstrap", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert (tmp_path / "admin-password").read_text().strip() == password
    assert User.objects.get(username="admin").check_password(password)
    assert oct((tmp_path / "admin-password").stat().st_mode & 0o777) == "0o600"
