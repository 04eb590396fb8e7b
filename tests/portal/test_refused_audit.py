"""Refused writes in the portal are audited as the API audits its own: a form's bad input
(400), a service's refusal (409) on a form or a button, each with the reason; the audit
page filters by user, object and outcome and shows why a refused action failed."""

import pytest
from django.urls import reverse

from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from network import services as network
from network.models import Network
from tenants.choices import Role
from tests.factories import make_network

pytestmark = pytest.mark.django_db


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def refused(project):
    return AuditEvent.objects.for_project(project).filter(outcome=AuditOutcome.FAILED)


def test_bad_form_input_is_a_400_and_audited(login, project, users_by_role):
    member = users_by_role[Role.MEMBER]
    response = login(member).post(url("networks", project), {"name": "Bad Name!"})
    assert response.status_code == 400
    event = refused(project).get()
    assert event.action == "portal.networks"
    assert event.actor == member
    assert event.source == "portal"
    assert event.detail["status"] == 400
    assert event.detail["code"] == "invalid"
    assert event.detail["message"].startswith("Name: ")
    assert "name" in event.detail["details"]
    assert not Network.objects.for_project(project).exists()


def test_a_service_refusal_on_a_form_is_audited_with_its_reason(login, project, users_by_role):
    net = make_network(project, "lab", cidr="10.1.0.0/24")
    response = login(users_by_role[Role.MEMBER]).post(
        url("network-detail", project, pk=net.pk), {"form": "subnet", "cidr": "10.1.0.128/25"}
    )
    assert response.status_code == 400
    assert "overlaps" in response.content.decode()
    event = refused(project).get()
    assert event.action == "portal.network_detail"
    assert event.detail["code"] == "invalid"
    assert "overlaps subnet 10.1.0.0/24" in event.detail["message"]
    assert event.detail["details"] == {"cidr": [event.detail["message"].split(": ", 1)[1]]}


def test_a_refused_button_is_audited_on_its_object(login, project, users_by_role):
    net = make_network(project, "lab", cidr="10.1.0.0/24")
    network.port_create(network=net)  # a port in use: the network cannot go
    response = login(users_by_role[Role.MEMBER]).post(
        url("network-delete", project, pk=net.pk), follow=True
    )
    assert response.status_code == 200
    assert Network.objects.filter(pk=net.pk).exists()
    event = refused(project).get()
    assert event.action == "portal.network_delete"
    assert event.object_type == "network.network"
    assert event.object_id == str(net.pk)
    assert event.detail["status"] == 409
    assert event.detail["message"] in response.content.decode()


def test_a_success_records_no_refusal(login, project, users_by_role):
    response = login(users_by_role[Role.MEMBER]).post(
        url("networks", project), {"name": "lab", "cidr": "10.2.0.0/24"}
    )
    assert response.status_code == 302
    assert not refused(project).exists()


def _events(project, owner, member):
    with audit.audit_context(actor=owner, source="api"):
        make_network(project, "alpha", cidr="10.3.0.0/24")
    with audit.audit_context(actor=member, source="portal"):
        audit.record(
            "portal.networks",
            project=project,
            outcome=AuditOutcome.FAILED,
            detail={"status": 400, "code": "invalid", "message": "Name: not a hostname"},
        )


def test_the_audit_page_filters_by_user_object_and_outcome(login, project, users_by_role):
    owner, member = project.owner, users_by_role[Role.MEMBER]
    _events(project, owner, member)
    client = login(users_by_role[Role.READER])
    page = url("audit", project)

    by_user = client.get(page, {"user": member.username}).content.decode()
    assert "portal.networks" in by_user and "network.create" not in by_user

    by_object = client.get(page, {"object": "alpha"}).content.decode()
    assert "network.create" in by_object and "portal.networks" not in by_object
    by_type = client.get(page, {"object": "network"}).content.decode()
    assert "network.create" in by_type

    failed = client.get(page, {"outcome": "failed"})
    assert failed.status_code == 200
    html = failed.content.decode()
    assert "portal.networks" in html and "network.create" not in html
    assert "Name: not a hostname" in html  # why it was refused

    nonsense = client.get(page, {"outcome": "nonsense", "user": "x" * 500})
    assert nonsense.status_code == 200


def test_the_audit_page_keeps_its_filters_across_pages(login, project, users_by_role):
    client = login(project.owner)
    for n in range(51):
        with audit.audit_context(actor=project.owner, source="portal"):
            audit.record("test.thing", project=project, object_repr=f"thing-{n}")
    html = client.get(url("audit", project), {"user": project.owner.username}).content.decode()
    assert f"user={project.owner.username}" in html


def test_a_write_at_another_projects_object_is_audited_as_denied(
    login, project, other_project, users_by_role
):
    theirs = make_network(other_project, "theirs", cidr="10.5.0.0/24")
    member = users_by_role[Role.MEMBER]
    response = login(member).post(url("network-delete", project, pk=theirs.pk))
    assert response.status_code == 404
    assert Network.objects.filter(pk=theirs.pk).exists()
    event = AuditEvent.objects.for_project(project).get(outcome=AuditOutcome.DENIED)
    assert event.action == "portal.network_delete"
    assert event.actor == member
    assert event.detail["status"] == 404
    assert not AuditEvent.objects.for_project(other_project).filter(actor=member).exists()
    # a read of nothing is not a write: nothing recorded
    login(member).get(url("network-detail", project, pk=theirs.pk))
    assert AuditEvent.objects.for_project(project).filter(outcome=AuditOutcome.DENIED).count() == 1
