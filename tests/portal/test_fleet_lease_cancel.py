"""An operator cancels any project's lease from the fleet's calendar
(``compute.services.lease_cancel``, audited), or changes whether it lends its idle GPUs;
anyone else gets the 404 page."""

import pytest
from django.urls import reverse

from compute.choices import LeaseState
from compute.models import Lease
from controlplane.models import AuditEvent
from tests.portal.test_leases import _one_now, at, local, reserve  # noqa: F401 (_one_now: autouse)

pytestmark = pytest.mark.django_db


def test_an_operator_cancels_a_projects_lease_from_the_calendar(login, project, cloud, staff):
    lease = reserve(project, 1, at(2), at(3), "soon")
    cancel = reverse("portal:fleet-lease-cancel", kwargs={"pk": lease.pk})
    operator = login(staff)
    assert cancel in operator.get(reverse("portal:fleet-leases")).content.decode()

    assert login(project.owner).post(cancel).status_code == 404  # operators only
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.SCHEDULED

    response = operator.post(cancel, follow=True)
    assert f"Lease {project.slug}/soon cancelled." in response.content.decode()
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.CANCELLED
    assert AuditEvent.objects.filter(action="lease.cancel").exists()
    assert 'data-lease="soon"' not in operator.get(reverse("portal:fleet-leases")).content.decode()


def test_an_operator_changes_a_projects_lease_lending_from_the_calendar(
    login, project, cloud, staff
):
    lease = reserve(project, 1, at(2), at(3), "soon")
    lending = reverse("portal:fleet-lease-lending", kwargs={"pk": lease.pk})
    operator = login(staff)
    assert lending in operator.get(reverse("portal:fleet-leases")).content.decode()

    assert login(project.owner).post(lending, {"lend_idle": "0"}).status_code == 404
    assert Lease.objects.get(pk=lease.pk).lend_idle

    response = operator.post(lending, {"lend_idle": "0"}, follow=True)
    assert (
        f"Lease {project.slug}/soon keeps its idle GPUs for its VMs." in response.content.decode()
    )
    assert not Lease.objects.get(pk=lease.pk).lend_idle
    audit = AuditEvent.objects.get(action="lease.update")
    assert audit.detail["lend_idle"] is False and audit.actor_id == staff.pk
    bad = operator.post(lending, {"lend_idle": "maybe"}, follow=True)
    assert "lend_idle" in bad.content.decode() and not Lease.objects.get(pk=lease.pk).lend_idle


def test_an_operator_changes_a_projects_lease(login, project, cloud, staff):
    lease = reserve(project, 1, at(2), at(3), "soon")
    moving = reverse("portal:fleet-lease-change", kwargs={"pk": lease.pk})
    operator = login(staff)
    assert moving in operator.get(reverse("portal:fleet-leases")).content.decode()
    assert login(project.owner).post(moving, {"ends_at": local(at(5))}).status_code == 404
    response = operator.post(moving, {"ends_at": local(at(5))}, follow=True)
    assert f"Lease {project.slug}/soon ends at {at(5):%Y-%m-%d %H:%M} UTC." in (
        response.content.decode()
    )
    assert Lease.objects.get(pk=lease.pk).ends_at == at(5)
    assert AuditEvent.objects.get(action="lease.update").actor_id == staff.pk
    grown = operator.post(moving, {"ends_at": local(at(5)), "gpus": "3"}, follow=True)
    assert f"Lease {project.slug}/soon holds 3 GPUs." in grown.content.decode()
    assert Lease.objects.get(pk=lease.pk).gpus == 3
