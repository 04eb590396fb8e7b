"""Isolation contracts of the tenancy endpoints under /projects/{slug}/."""

from tenants.choices import Role
from tenants.models import Membership
from tests.factories import add_member
from tests.isolation import ProjectEndpointContract


class TestMembersIsolation(ProjectEndpointContract):
    basename = "project-member"
    write_role = Role.ADMIN
    actions = ("list", "retrieve", "update", "delete")  # no create: people are invited

    def make_object(self, project):
        return Membership.objects.get(project=project, user=add_member(project, role=Role.READER))

    def lookup(self, obj):
        return obj.user.username

    def item_id(self, item):
        return item["user"]["username"]

    missing_lookup = "nobody-at-all"

    def update_payload(self, obj):
        return {"role": Role.MEMBER}

    def count(self, project):
        return Membership.objects.for_project(project).count()


class TestQuotaIsolation(ProjectEndpointContract):
    basename = "project-quota"
    singleton = True
    actions = ("list",)
