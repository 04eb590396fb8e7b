"""Isolation contracts of the audit trail and operations under /projects/{slug}/."""

from controlplane import audit
from controlplane.services import operation_create
from tests.isolation import ProjectEndpointContract


class TestAuditEventsIsolation(ProjectEndpointContract):
    basename = "project-auditevent"
    actions = ("list", "retrieve")

    def make_object(self, project):
        return audit.record("test.event", project, project=project)


class TestOperationsIsolation(ProjectEndpointContract):
    basename = "project-operation"
    actions = ("list", "retrieve")
    missing_lookup = "00000000-0000-0000-0000-000000000000"

    def make_object(self, project):
        return operation_create(kind="test.work", target=project, project=project)
