"""Operators' pages: every project with its owner, status, validity and quota (set through
``tenants.services.quota_set``), and every host in one table; a 404 for anyone else."""

import pytest
from django.urls import reverse

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_host

pytestmark = pytest.mark.django_db


def test_operators_see_every_project(login, staff, project, other_project):
    html = login(staff).get(reverse("portal:fleet-projects")).content.decode()
    for p in (project, other_project):
        assert f'data-project="{p.slug}"' in html
        assert p.owner.username in html
    assert "Memory (GiB)" in html


def test_operators_set_a_quota(login, staff, project):
    client = login(staff)
    page = reverse("portal:project-quota", kwargs={"slug": project.slug})
    assert "Memory (GiB)" in client.get(page).content.decode()
    limits = {name: 3 for name in Quota.RESOURCES}
    response = client.post(page, {**limits, "gpus": 8})
    assert response.status_code == 302
    quota = Quota.objects.get(project=project)
    assert quota.gpus == 8 and quota.vcpus == 3
    event = AuditEvent.objects.for_project(project).get(action="quota.update")
    assert event.actor == staff and event.outcome == AuditOutcome.SUCCESS


@pytest.mark.parametrize("bad", [-1, "many", ""])
def test_a_bad_limit_is_a_400_naming_the_field(login, staff, project, bad):
    before = Quota.objects.get(project=project).gpus
    limits = {name: 3 for name in Quota.RESOURCES}
    response = login(staff).post(
        reverse("portal:project-quota", kwargs={"slug": project.slug}), {**limits, "gpus": bad}
    )
    assert response.status_code == 400
    assert 'data-field="gpus"' in response.content.decode()
    assert Quota.objects.get(project=project).gpus == before
    assert AuditEvent.objects.filter(
        action="portal.project_quota", outcome=AuditOutcome.FAILED, actor=staff
    ).exists()


def test_a_missing_project_is_404(login, staff):
    page = reverse("portal:project-quota", kwargs={"slug": "no-such-project"})
    assert login(staff).get(page).status_code == 404


def test_the_fleet_lists_every_host(login, staff):
    make_host("gpu-01")
    make_host("cpu-01", kind="cpu")
    html = login(staff).get(reverse("portal:fleet")).content.decode()
    assert 'id="all-hosts"' in html
    assert 'data-all-hosts="gpu-01"' in html and 'data-all-hosts="cpu-01"' in html
    assert 'action="/fleet/hosts/gpu-01/state/"' in html  # drain / maintenance stays


@pytest.mark.parametrize("role", [Role.OWNER, Role.ADMIN, Role.READER])
def test_operators_pages_are_404_for_everyone_else(login, project, users_by_role, role):
    client = login(users_by_role[role])
    assert client.get(reverse("portal:fleet-projects")).status_code == 404
    page = reverse("portal:project-quota", kwargs={"slug": project.slug})
    limits = {name: 999 for name in Quota.RESOURCES}
    assert client.get(page).status_code == 404
    assert client.post(page, limits).status_code == 404
    assert Quota.objects.get(project=project).gpus != 999
