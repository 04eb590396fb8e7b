"""Isolation contracts of compute's project endpoints."""

from compute.models import Host, Image, Lease, PlacementGroup, VirtualMachine
from tests.factories import make_image, make_template, make_vm
from tests.isolation import ProjectEndpointContract


class TestVirtualMachineIsolation(ProjectEndpointContract):
    basename = "project-vm"
    actions = ("list", "retrieve", "create", "delete")
    object_actions = (
        ("post", "start/"),
        ("post", "stop/"),
        ("post", "reboot/"),
        ("post", "reset/"),
        ("post", "power-off/"),
        ("get", "console-log/"),
        ("post", "console/"),
        ("post", "shelve/"),
        ("post", "unshelve/"),
    )
    missing_lookup = "00000000-0000-4000-8000-000000000000"

    def make_object(self, project):
        return make_vm(project)

    def create_payload(self, project):
        return {"name": "web-1", "template": make_template().name, "image": make_image().pk}

    def foreign_payloads(self, project, other):
        theirs = make_image(project=other)
        group = PlacementGroup.objects.create(project=other, name="theirs", policy="affinity")
        template = make_template().name
        return [
            {"name": "x1", "template": template, "image": theirs.pk},
            {
                "name": "x2",
                "template": template,
                "image": make_image().pk,
                "placement_group": group.name,
            },
            {
                "name": "x3",
                "template": make_template(gpus=1).name,
                "image": make_image().pk,
                "lease": _their_lease(other).name,
            },
        ]

    def count(self, project):
        return VirtualMachine.objects.for_project(project).exclude(state="deleted").count()


class TestProjectImageIsolation(ProjectEndpointContract):
    object_actions = (("put", "file/"),)
    basename = "project-image"
    actions = ("list", "retrieve", "create", "delete")
    create_references_nothing = True

    def make_object(self, project):
        return make_image(project=project)

    def create_payload(self, project):
        return {"name": "mine", "os_distro": "rocky", "format": "qcow2", "login_user": "rocky"}

    def count(self, project):
        return Image.objects.filter(project=project).count()


class TestPlacementGroupIsolation(ProjectEndpointContract):
    basename = "project-placementgroup"
    actions = ("list", "retrieve", "create", "delete")
    create_references_nothing = True

    def make_object(self, project):
        from compute import services

        return services.placement_group_create(
            project=project, name=f"g{PlacementGroup.objects.count()}", policy="compact"
        )

    def create_payload(self, project):
        return {"name": f"new-{PlacementGroup.objects.count()}", "policy": "anti_affinity"}

    def count(self, project):
        return PlacementGroup.objects.for_project(project).count()


class TestLeaseIsolation(ProjectEndpointContract):
    basename = "project-lease"
    write_role = "admin"  # a lease is billed whether used or not
    actions = ("list", "retrieve", "create")
    object_actions = (("post", "cancel/"),)
    create_references_nothing = True

    def make_object(self, project):
        from compute import services

        return services.lease_create(
            project=project, name=f"l{Lease.objects.count()}", gpus=1, **_period()
        )

    def create_payload(self, project):
        period = _period()
        return {
            "name": f"new-{Lease.objects.count()}",
            "gpus": 1,
            "starts_at": period["starts_at"].isoformat(),
            "ends_at": period["ends_at"].isoformat(),
        }

    def count(self, project):
        return Lease.objects.for_project(project).count()


def _period():
    from datetime import timedelta

    from django.utils import timezone

    from tests.factories import make_host

    if not Host.objects.exists():
        make_host("gpu-lease")
    # Each lease a day of its own: as many as a test makes fit on one host's GPUs.
    start = timezone.now() + timedelta(days=1 + Lease.objects.count())
    return {"starts_at": start, "ends_at": start + timedelta(hours=1)}


def _their_lease(project):
    from compute import services

    return services.lease_create(project=project, name="theirs", gpus=1, **_period())
