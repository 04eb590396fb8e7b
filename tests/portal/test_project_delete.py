"""Deleting a project from its settings page: its owner only, asked first, through
``tenants.services.project_delete``: a project that holds something, or was ever billed, is
kept and the page says why, audited as the API's refusal is."""

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from tenants import usage
from tenants.choices import Role
from tenants.models import Project, UsageRecord
from tests.factories import make_network
from tests.tenants.test_billing import Subject

pytestmark = pytest.mark.django_db


def settings_url(project):
    return reverse("portal:project-settings", kwargs={"slug": project.slug})


def delete_url(project):
    return reverse("portal:project-delete", kwargs={"slug": project.slug})


def said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_owner_deletes_an_empty_project_after_being_asked(login, project):
    client = login(project.owner)
    page = client.get(settings_url(project)).content.decode()
    assert f'action="{delete_url(project)}"' in page
    assert f'data-confirm="Delete project {project.slug}? This cannot be undone."' in page
    slug = project.slug
    response = client.post(delete_url(project))
    assert response.status_code == 302
    assert response.url == reverse("portal:home")
    assert said(response) == [f"Project {slug} deleted."]
    assert not Project.objects.filter(slug=slug).exists()
    event = AuditEvent.objects.get(action="project.delete", project_slug=slug)
    assert (event.outcome, event.actor) == (AuditOutcome.SUCCESS, project.owner)


@pytest.mark.parametrize("role", [Role.ADMIN, Role.MEMBER, Role.READER])
def test_only_its_owner_may(login, project, users_by_role, role):
    client = login(users_by_role[role])
    page = client.get(settings_url(project)).content.decode()
    assert f'action="{delete_url(project)}"' not in page
    response = client.post(delete_url(project))
    assert response.status_code == 403
    assert Project.objects.filter(pk=project.pk).exists()


def test_a_get_deletes_nothing(login, project):
    assert login(project.owner).get(delete_url(project)).status_code == 405
    assert Project.objects.filter(pk=project.pk).exists()


def test_a_project_holding_something_is_kept_and_the_page_says_what(login, project):
    make_network(project)
    response = login(project.owner).post(delete_url(project), follow=True)
    assert response.redirect_chain == [(settings_url(project), 302)]
    assert f"project {project.slug} still holds resources (networks=1)" in (
        response.content.decode()
    )
    assert Project.objects.filter(pk=project.pk).exists()
    refusal = AuditEvent.objects.for_project(project).get(action="portal.project_delete")
    assert refusal.outcome == AuditOutcome.FAILED
    assert refusal.detail["code"] == "project_not_empty"


def test_a_billed_project_is_kept_with_its_bills(login, project):
    ran = Subject(project, "a-vm-deleted-since")  # ran an hour: its usage interval stays
    start = timezone.now() - timedelta(hours=2)
    usage.usage_open(ran, "vcpu", 4, start)
    usage.usage_close(ran, "vcpu", at=start + timedelta(hours=1))
    response = login(project.owner).post(delete_url(project), follow=True)
    assert response.redirect_chain == [(settings_url(project), 302)]
    page = response.content.decode()
    assert "its bills are kept" in page and "it ends with its validity" in page
    assert Project.objects.filter(pk=project.pk).exists()
    assert UsageRecord.objects.for_project(project).count() == 1
    refusal = AuditEvent.objects.for_project(project).get(action="portal.project_delete")
    assert (refusal.outcome, refusal.detail["code"]) == (AuditOutcome.FAILED, "project_billed")
