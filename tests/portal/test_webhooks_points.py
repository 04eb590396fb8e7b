"""Webhooks in the portal (admins create and delete; the secret shown once; each one's last
delivery and the project's recent events listed) and the prepaid points on the billing
page."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.urls import reverse

from controlplane import services
from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent, Event, Webhook
from tenants import billing
from tenants.choices import PointsKind, Role
from tests.factories import make_project

pytestmark = pytest.mark.django_db

HOOK = "https://example.org/hook"


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def test_an_admin_creates_a_webhook_and_sees_its_secret_once(login, project, users_by_role):
    client = login(users_by_role[Role.ADMIN])
    response = client.post(
        url("webhooks", project), {"url": HOOK, "kinds": "vm.eviction_notice, budget.alert"}
    )
    assert response.status_code == 200
    hook = Webhook.objects.for_project(project).get()
    assert hook.kinds == ["vm.eviction_notice", "budget.alert"]
    assert hook.secret in response.content.decode()
    assert hook.secret not in client.get(url("webhooks", project)).content.decode()
    assert (
        AuditEvent.objects.for_project(project)
        .filter(action="webhook.create", outcome=AuditOutcome.SUCCESS, object_id=str(hook.pk))
        .exists()
    )


def test_the_page_lists_deliveries_and_recent_events(login, project, users_by_role):
    hook, _ = services.webhook_create(project=project, url=HOOK)
    Webhook.objects.filter(pk=hook.pk).update(
        last_delivery_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), last_status="HTTP 204"
    )
    Event.objects.create(project=project, kind="vm.eviction_notice", message="train-1 goes")
    html = login(users_by_role[Role.READER]).get(url("webhooks", project)).content.decode()
    assert HOOK in html and "2026-01-02 03:04:05" in html and "HTTP 204" in html
    assert "vm.eviction_notice" in html and "train-1 goes" in html
    assert 'id="webhook-create"' not in html


@pytest.mark.parametrize(
    "data, field",
    [
        ({"url": ""}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "http://127.0.0.1/hook"}, "url"),  # the service's egress rule
        ({"url": HOOK, "kinds": "x" * 65}, "kinds"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(login, project, users_by_role, data, field):
    response = login(users_by_role[Role.ADMIN]).post(url("webhooks", project), data)
    assert response.status_code == 400
    assert f'data-field="{field}"' in response.content.decode()
    assert not Webhook.objects.exists()
    assert (
        AuditEvent.objects.for_project(project)
        .filter(action="portal.webhooks", outcome=AuditOutcome.FAILED)
        .exists()
    )


def test_an_admin_deletes_a_webhook(login, project, users_by_role):
    hook, _ = services.webhook_create(project=project, url=HOOK)
    response = login(users_by_role[Role.ADMIN]).post(url("webhook-delete", project, pk=hook.pk))
    assert response.status_code == 302
    assert not Webhook.objects.filter(pk=hook.pk).exists()
    assert AuditEvent.objects.for_project(project).filter(action="webhook.delete").exists()


@pytest.mark.parametrize("role", [Role.MEMBER, Role.READER])
def test_below_admin_cannot_write(login, project, users_by_role, role):
    hook, _ = services.webhook_create(project=project, url=HOOK)
    client = login(users_by_role[role])
    assert client.get(url("webhooks", project)).status_code == 200
    assert client.post(url("webhooks", project), {"url": HOOK}).status_code == 403
    assert client.post(url("webhook-delete", project, pk=hook.pk)).status_code == 403
    assert Webhook.objects.for_project(project).count() == 1


def test_outsiders_get_404(login, project):
    assert login(make_project().owner).get(url("webhooks", project)).status_code == 404


# --- points -------------------------------------------------------------------------------


def test_the_billing_page_shows_the_points_balance_and_ledger(
    login, project, users_by_role, staff, rate_card
):
    billing.points_credit(project=project, amount=Decimal("120"), note="grant 2026", actor=staff)
    billing.points_credit(
        project=project, amount=Decimal("-20"), kind=PointsKind.ADJUSTMENT, note="correction"
    )
    response = login(users_by_role[Role.READER]).get(url("billing", project))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="points-balance">100.00<' in html
    assert "grant 2026" in html and "correction" in html
    assert "120.00" in html and "-20.00" in html


def test_another_projects_points_are_not_shown(login, project, other_project, rate_card):
    billing.points_credit(project=other_project, amount=Decimal("77"), note="theirs")
    html = login(project.owner).get(url("billing", project)).content.decode()
    assert "theirs" not in html
    assert 'id="points-balance">0.00<' in html
