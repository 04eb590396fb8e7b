"""``manage.py bootstrap``: the admin user, a demo project and its member, the VM templates
and an image for the simulated hosts, and the federation's metadata when one is configured
(``KUMO_SAML_METADATA_URL``). Run it again and
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


# mdx-like packs: per GPU, 16 vCPUs and 57 GiB (an eighth of a 128-vCPU, 460 GiB node).
TEMPLATES = [
    {"name": "cpu-4", "vcpus": 4, "memory_gib": 16, "disk_gib": 40},
    {"name": "cpu-16", "vcpus": 16, "memory_gib": 64, "disk_gib": 100},
    *(
        {
            "name": f"gpu-{n}",
            "vcpus": 16 * n,
            "memory_gib": 56 * n,
            "gpus": n,
            "gpu_model": "A100-SXM4-40GB",
            "disk_gib": 200,
        }
        for n in (1, 2, 4, 8)
    ),
]
# Simulated hosts read no disk: this image names a path no host needs to hold.
SIM_IMAGE = {
    "name": "ubuntu-24.04",
    "os_distro": "ubuntu",
    "os_version": "24.04",
    "format": "qcow2",
    "location": "/var/lib/kumo/images/ubuntu-24.04.qcow2",
    "checksum": "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "description": "for simulated hosts (libvirt's test driver reads no disk)",
}


def _catalog() -> None:
    from compute import services as compute
    from compute.models import Image, Template

    for fields in TEMPLATES:
        if not Template.objects.filter(name=fields["name"]).exists():
            compute.template_create(**fields)
    if not Image.objects.filter(name=SIM_IMAGE["name"], project=None).exists():
        compute.image_create(**SIM_IMAGE)
    # Kumo's real guest image, once `make image` has built it (nothing is built here).
    from compute.services.guest_image import guest_image_register_cached

    guest_image_register_cached()


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
            _catalog()
        self.credentials = {"admin": admin_pw, "alice": alice_pw}
        self.stdout.write(f"admin / {admin_pw}   (staff, owner of project {DEMO_PROJECT})")
        self.stdout.write(f"alice / {alice_pw}   (member of project {DEMO_PROJECT})")
        if settings.SAML_METADATA_URL:
            self._federation()

    def _federation(self):
        """Load the configured federation's aggregate now, so institutional login works
        before beat's first refresh."""
        from tenants.federation import metadata

        row = metadata.metadata_refresh()
        if row.last_error:
            self.stderr.write(f"federation metadata {row.source} refused: {row.last_error}")
        else:
            self.stdout.write(f"federation metadata {row.source}: {row.idp_count} institutions")
