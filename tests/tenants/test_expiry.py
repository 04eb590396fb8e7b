from datetime import date

import pytest

from controlplane.models import AuditEvent
from tenants import services
from tenants.choices import ProjectStatus
from tests.factories import make_project

pytestmark = pytest.mark.django_db


def test_projects_past_their_validity_expire_once():
    ended = make_project(valid_until=date(2026, 3, 31))
    ongoing = make_project(valid_until=date(2026, 4, 1))
    open_ended = make_project()
    assert services.projects_expire(today=date(2026, 4, 1)) == [ended.slug]
    assert services.projects_expire(today=date(2026, 4, 1)) == []
    ended.refresh_from_db(), ongoing.refresh_from_db(), open_ended.refresh_from_db()
    assert ended.status == ProjectStatus.EXPIRED
    assert ongoing.status == open_ended.status == ProjectStatus.ACTIVE
    event = AuditEvent.objects.get(action="project.set_status", project=ended)
    assert event.detail == {"from": "active", "to": "expired", "reason": "valid until 2026-03-31"}
