"""A project's settings page: admins change its name, description and validity (what the
API's project PATCH changes), through ``tenants.services.project_update``, audited."""

from datetime import date

import pytest
from django.urls import reverse

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from tenants.choices import Role
from tenants.models import Project
from tests.factories import make_project

pytestmark = pytest.mark.django_db


def url(project):
    return reverse("portal:project-settings", kwargs={"slug": project.slug})


def test_an_admin_changes_the_settings(login, project, users_by_role):
    client = login(users_by_role[Role.ADMIN])
    assert f'value="{project.name}"' in client.get(url(project)).content.decode()
    response = client.post(
        url(project),
        {
            "name": "Protein folding",
            "description": "Runs on A100s.",
            "valid_from": "2026-01-01",
            "valid_until": "2026-12-31",
        },
    )
    assert response.status_code == 302
    project.refresh_from_db()
    assert project.name == "Protein folding"
    assert project.description == "Runs on A100s."
    assert (project.valid_from, project.valid_until) == (date(2026, 1, 1), date(2026, 12, 31))
    event = AuditEvent.objects.for_project(project).get(action="project.update")
    assert event.outcome == AuditOutcome.SUCCESS
    assert event.actor == users_by_role[Role.ADMIN]
    assert event.detail["name"] == "Protein folding"


@pytest.mark.parametrize(
    "data, field",
    [
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": "ok", "valid_from": "someday"}, "valid_from"),
        ({"name": "ok", "valid_from": "2026-06-01", "valid_until": "2026-01-01"}, "valid_until"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(login, project, data, field):
    before = Project.objects.get(pk=project.pk)
    response = login(project.owner).post(url(project), data)
    assert response.status_code == 400
    assert f'data-field="{field}"' in response.content.decode()
    project.refresh_from_db()
    assert (project.name, project.valid_until) == (before.name, before.valid_until)
    assert (
        AuditEvent.objects.for_project(project)
        .filter(action="portal.project_settings", outcome=AuditOutcome.FAILED)
        .exists()
    )


@pytest.mark.parametrize("role", [Role.MEMBER, Role.READER])
def test_below_admin_reads_but_cannot_change(login, project, users_by_role, role):
    client = login(users_by_role[role])
    page = client.get(url(project))
    assert page.status_code == 200
    assert 'id="project-settings"' not in page.content.decode()
    assert client.post(url(project), {"name": "mine now"}).status_code == 403
    project.refresh_from_db()
    assert project.name != "mine now"


def test_outsiders_get_404(login, project):
    response = login(make_project().owner).post(url(project), {"name": "theirs"})
    assert response.status_code == 404
    project.refresh_from_db()
    assert project.name != "theirs"
