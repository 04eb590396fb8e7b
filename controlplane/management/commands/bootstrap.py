"""``manage.py bootstrap``: the admin user, a demo project and its member. Run it again and
nothing is duplicated: existing users and the project are kept as they are."""

import secrets

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction

from controlplane import audit
from controlplane.choices import AuditSource
from tenants import services
from tenants.choices import Role
from tenants.models import Membership, Project, User

DEMO_PROJECT = "demo"


def _password(name: str) -> str:
    """A password generated once into var/<name>-password and read back after that."""
    path = settings.VAR_DIR / f"{name}-password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()


def _user(username: str, *, email: str, is_staff: bool) -> tuple[User, str]:
    password = _password(username)
    user = User.objects.filter(username=username).first()
    if user is None:
        user = services.user_create(
            username=username, email=email, password=password, is_staff=is_staff
        )
    return user, password


class Command(BaseCommand):
    help = "Create the admin user, a demo project and a demo member (idempotent)."

    def handle(self, *args, **options):
        with audit.audit_context(source=AuditSource.SYSTEM), transaction.atomic():
            admin, admin_pw = _user("admin", email="admin@kumo.localhost", is_staff=True)
            alice, alice_pw = _user("alice", email="alice@kumo.localhost", is_staff=False)
            project = Project.objects.filter(slug=DEMO_PROJECT).first()
            if project is None:
                project = services.project_create(
                    slug=DEMO_PROJECT,
                    name="Demo research project",
                    description="Created by `make run` to try Kumo out.",
                    owner=admin,
                )
            if not Membership.objects.filter(project=project, user=alice).exists():
                services.membership_add(project=project, user=alice, role=Role.MEMBER)
        self.credentials = {"admin": admin_pw, "alice": alice_pw}
        self.stdout.write(f"admin / {admin_pw}   (staff, owner of project {DEMO_PROJECT})")
        self.stdout.write(f"alice / {alice_pw}   (member of project {DEMO_PROJECT})")
