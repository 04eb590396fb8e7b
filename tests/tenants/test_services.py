"""tenants/services.py (and the quota counting in tenants/quotas.py it relies on)."""

from datetime import date, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from controlplane.choices import AuditOutcome
from controlplane.errors import Conflict, InvalidInput, PermissionDenied, QuotaExceeded
from controlplane.models import AuditEvent
from tenants import quotas, services
from tenants.choices import ProjectStatus, Role
from tenants.models import ApiToken, Membership, Project, Quota, User
from tests.factories import UserFactory, add_member, make_project

pytestmark = pytest.mark.django_db


@pytest.fixture
def counters(monkeypatch):
    """A private copy of the usage counters: what a test registers is gone after it."""
    monkeypatch.setattr(quotas, "_counters", {k: list(v) for k, v in quotas._counters.items()})
    monkeypatch.setattr(quotas, "_count_groups", list(quotas._count_groups))
    return quotas._counters


def _events(action):
    return AuditEvent.objects.filter(action=action)


# --- users --------------------------------------------------------------------------------------


def test_user_create_hashes_the_password_and_audits():
    user = services.user_create(username="hanako", email="h@example.ac.jp", password="v3ry-l0ng!x")
    assert user.check_password("v3ry-l0ng!x")
    assert user.password != "v3ry-l0ng!x"
    assert _events("user.create").filter(object_id=str(user.pk)).count() == 1


def test_user_create_without_password_cannot_log_in():
    assert not services.user_create(username="robot").has_usable_password()


def test_user_create_refuses_a_weak_password_naming_password():
    with pytest.raises(InvalidInput) as e:
        services.user_create(username="taro", password="123")
    assert "password" in e.value.details
    assert not User.objects.filter(username="taro").exists()


def test_user_create_taken_username_is_conflict():
    UserFactory(username="jiro")
    with pytest.raises(Conflict) as e:
        services.user_create(username="jiro")
    assert e.value.details == {"username": ["taken"]}


# --- projects -----------------------------------------------------------------------------------


def test_project_create_makes_owner_membership_and_default_quota(settings):
    owner = UserFactory()
    project = services.project_create(
        slug="genomics", name="Genomics", owner=owner, quota={"gpus": 2}
    )
    assert Membership.objects.get(project=project).user == owner
    assert Membership.objects.get(project=project).role == Role.OWNER
    quota = Quota.objects.get(project=project)
    assert quota.gpus == 2
    assert quota.vcpus == settings.DEFAULT_QUOTA["vcpus"]
    event = _events("project.create").get(project=project)
    assert event.detail == {"owner": owner.username}


@pytest.mark.parametrize("slug", ["ab", "Upper", "1starts-with-digit", "ends-", "under_score"])
def test_project_create_invalid_slug_names_slug(slug):
    with pytest.raises(InvalidInput) as e:
        services.project_create(slug=slug, name="x", owner=UserFactory())
    assert list(e.value.details) == ["slug"]
    assert not Project.objects.filter(slug=slug).exists()


def test_project_create_duplicate_slug_is_conflict():
    make_project(slug="taken-slug")
    with pytest.raises(Conflict):
        services.project_create(slug="taken-slug", name="x", owner=UserFactory())
    assert Project.objects.filter(slug="taken-slug").count() == 1


def test_project_validity_must_be_ordered():
    with pytest.raises(InvalidInput) as e:
        make_project(valid_from=date(2026, 4, 1), valid_until=date(2026, 3, 1))
    assert "valid_until" in e.value.details


def test_project_update_changes_only_editable_fields_and_audits_changes(project):
    with pytest.raises(InvalidInput) as e:
        services.project_update(project=project, slug="renamed")
    assert "slug" in e.value.details
    services.project_update(project=project, name="New name", description="d")
    project.refresh_from_db()
    assert (project.name, project.description) == ("New name", "d")
    event = _events("project.update").get(project=project)
    assert event.detail == {"name": "New name", "description": "d"}
    services.project_update(project=project, name="New name")  # nothing changes
    assert _events("project.update").filter(project=project).count() == 1


def test_project_set_status_is_audited_once_and_checks_the_value(project):
    services.project_set_status(project=project, status=ProjectStatus.SUSPENDED, reason="bill")
    services.project_set_status(project=project, status=ProjectStatus.SUSPENDED)
    project.refresh_from_db()
    assert project.status == ProjectStatus.SUSPENDED
    event = _events("project.set_status").get(project=project)
    assert event.detail == {"from": "active", "to": "suspended", "reason": "bill"}
    with pytest.raises(InvalidInput):
        services.project_set_status(project=project, status="deleted")


def test_project_delete_of_an_empty_project(project, counters):
    slug = project.slug
    services.project_delete(project=project)
    assert not Project.objects.filter(slug=slug).exists()
    assert _events("project.delete").get(project_slug=slug).outcome == AuditOutcome.SUCCESS


def test_project_delete_with_resources_is_conflict(project, counters):
    quotas.register_usage("vms", lambda p: 2 if p.pk == project.pk else 0)
    with pytest.raises(Conflict) as e:
        services.project_delete(project=project)
    assert e.value.code == "project_not_empty"
    assert e.value.details == {"usage": {"vms": 2}}
    assert Project.objects.filter(pk=project.pk).exists()


def test_a_billed_project_is_not_deleted_and_keeps_its_records(project, counters, client_for):
    """Its usage intervals (what a VM ran), and so the invoices rated from them, and its
    points ledger would go with it: a bill outlives what it bills."""
    from decimal import Decimal

    from tenants import usage
    from tenants.billing import points_credit
    from tenants.models import PointsEntry, UsageRecord
    from tests.tenants.test_billing import Subject

    ran = Subject(project, "a-vm-deleted-since")
    start = timezone.now() - timedelta(hours=2)
    usage.usage_open(ran, "vcpu", 4, start)
    usage.usage_close(ran, "vcpu", at=start + timedelta(hours=1))
    with pytest.raises(Conflict) as e:
        services.project_delete(project=project)
    assert (e.value.code, e.value.details) == ("project_billed", {"billing": ["usage_records"]})
    points_credit(project=project, amount=Decimal("100"))
    api = client_for(project.owner)
    answer = api.delete(f"/api/v1/projects/{project.slug}/")
    assert answer.status_code == 409
    assert answer.json()["code"] == "project_billed"
    assert answer.json()["details"]["billing"] == ["usage_records", "points_entries"]
    assert Project.objects.filter(pk=project.pk).exists()
    assert UsageRecord.objects.for_project(project).count() == 1
    assert PointsEntry.objects.for_project(project).count() == 1


# --- memberships --------------------------------------------------------------------------------


def test_membership_add_twice_is_conflict(project):
    user = add_member(project)
    with pytest.raises(Conflict) as e:
        services.membership_add(project=project, user=user)
    assert e.value.code == "already_member"


def test_only_owners_and_operators_grant_owner(users_by_role, project, staff):
    admin = users_by_role[Role.ADMIN]
    with pytest.raises(PermissionDenied):
        services.membership_add(project=project, user=UserFactory(), role=Role.OWNER, actor=admin)
    services.membership_add(
        project=project, user=UserFactory(), role=Role.OWNER, actor=project.owner
    )
    services.membership_add(project=project, user=UserFactory(), role=Role.OWNER, actor=staff)
    assert Membership.objects.filter(project=project, role=Role.OWNER).count() == 3


def test_admin_cannot_demote_or_remove_an_owner(users_by_role, project):
    admin = users_by_role[Role.ADMIN]
    second = add_member(project, role=Role.OWNER)
    membership = Membership.objects.get(project=project, user=second)
    with pytest.raises(PermissionDenied):
        services.membership_update(membership=membership, role=Role.MEMBER, actor=admin)
    with pytest.raises(PermissionDenied):
        services.membership_remove(membership=membership, actor=admin)
    assert services.role_of(second, project) == Role.OWNER


def test_last_owner_cannot_be_demoted_or_removed(project):
    owner = Membership.objects.get(project=project, user=project.owner)
    for attempt in (
        lambda: services.membership_update(membership=owner, role=Role.ADMIN),
        lambda: services.membership_remove(membership=owner),
    ):
        with pytest.raises(Conflict) as e:
            attempt()
        assert e.value.code == "last_owner"
    assert services.role_of(project.owner, project) == Role.OWNER


def test_an_owner_can_step_down_when_another_owner_remains(project):
    add_member(project, role=Role.OWNER)
    owner = Membership.objects.get(project=project, user=project.owner)
    services.membership_update(membership=owner, role=Role.ADMIN, actor=project.owner)
    assert services.role_of(project.owner, project) == Role.ADMIN
    event = _events("membership.update").get(project=project)
    assert event.detail == {"user": project.owner.username, "from": "owner", "to": "admin"}


def test_membership_remove_revokes_only_tokens_scoped_to_that_project(project, other_project):
    user = add_member(project)
    add_member(other_project, user)
    here, _ = services.token_create(user=user, name="here", project=project)
    there, _ = services.token_create(user=user, name="there", project=other_project)
    unscoped, _ = services.token_create(user=user, name="all")
    services.membership_remove(membership=Membership.objects.get(project=project, user=user))
    assert services.role_of(user, project) is None
    for token in (here, there, unscoped):
        token.refresh_from_db()
    assert here.revoked_at is not None
    assert there.revoked_at is None and unscoped.revoked_at is None


# --- quotas -------------------------------------------------------------------------------------


def test_quota_set_audits_from_and_to_and_refuses_bad_values(project, settings):
    services.quota_set(project=project, vcpus=8, gpus=project.quota.gpus)
    assert Quota.objects.get(project=project).vcpus == 8
    event = _events("quota.update").get(project=project)
    # an unchanged limit (gpus) is not in the trail
    assert event.detail == {"vcpus": {"from": settings.DEFAULT_QUOTA["vcpus"], "to": 8}}
    with pytest.raises(InvalidInput) as e:
        services.quota_set(project=project, vcpus=-1)
    assert "vcpus" in e.value.details
    with pytest.raises(InvalidInput) as e:
        services.quota_set(project=project, teapots=1)
    assert "teapots" in e.value.details


def test_usage_is_counted_from_registered_counters(project, other_project, counters):
    assert quotas.usage(project)["vcpus"] == 0
    quotas.register_usage("vcpus", lambda p: 3 if p.pk == project.pk else 1)
    quotas.register_usage("vcpus", lambda p: 2)
    assert quotas.usage(project)["vcpus"] == 5
    assert quotas.usage(other_project)["vcpus"] == 3


def test_grouped_counts_add_to_single_counters(project, counters):
    base = quotas.usage(project)
    quotas.register_usage("vcpus", lambda p: 2)
    quotas.register_usage_counts(lambda p: {"vcpus": 3, "gpus": 1})
    used = quotas.usage(project)
    assert (used["vcpus"], used["gpus"]) == (base["vcpus"] + 5, base["gpus"] + 1)
    quotas.register_usage_counts(lambda p: {"teapots": 1})
    with pytest.raises(ValueError, match="teapots"):
        quotas.usage(project)


def test_a_check_counts_only_the_resources_it_is_asked_for(project, counters):
    asked = []
    quotas.register_usage_counts(lambda p: asked.append("gpu") or {"gpus": 7}, ("gpus",))
    quotas.register_usage_counts(
        lambda p: asked.append("ips") or {"global_ips": 9}, ("global_ips",)
    )
    services.quota_set(project=project, gpus=8)
    with transaction.atomic():
        quotas.check(project, gpus=1)  # 7 in use + 1 fits
    assert asked == ["gpu"]
    with pytest.raises(QuotaExceeded), transaction.atomic():
        quotas.check(project, gpus=2)
    assert quotas.usage(project)["global_ips"] >= 9 and "ips" in asked  # a full count asks all


def test_register_usage_refuses_an_unknown_resource(counters):
    with pytest.raises(ValueError, match="teapots"):
        quotas.register_usage("teapots", lambda p: 0)


def test_check_raises_quota_exceeded_when_over(project, counters):
    services.quota_set(project=project, vms=3)
    quotas.register_usage("vms", lambda p: 2)
    with transaction.atomic():
        assert quotas.check(project, vms=1).vms == 3  # exactly at the limit fits
    with pytest.raises(QuotaExceeded) as e, transaction.atomic():
        quotas.check(project, vms=2)
    assert (e.value.status, e.value.code) == (409, "quota_exceeded")
    assert e.value.details == {"vms": ["limit 3, in use 2, requested 2"]}


@pytest.mark.django_db(transaction=True)
def test_check_outside_a_transaction_is_a_programming_error(counters):
    project = make_project()
    with pytest.raises(RuntimeError, match="inside the creating transaction"):
        quotas.check(project, vms=1)


# --- tokens -------------------------------------------------------------------------------------


def test_token_is_stored_hashed_and_the_secret_is_nowhere_in_the_row(project):
    token, secret = services.token_create(user=project.owner, name="ci", project=project)
    assert secret.startswith(f"kumo_{token.prefix}_")
    row = ApiToken.objects.filter(pk=token.pk).values().get()
    assert row["digest"] == services.token_digest(secret) != secret
    private_part = secret.rsplit("_", 1)[1]
    for value in row.values():
        assert secret not in str(value)
        assert private_part not in str(value)


def test_token_create_refuses_past_expiry_and_foreign_projects(other_project):
    user = UserFactory()
    with pytest.raises(InvalidInput) as e:
        services.token_create(user=user, name="x", expires_at=timezone.now())
    assert "expires_at" in e.value.details
    with pytest.raises(InvalidInput) as e:
        services.token_create(user=user, name="x", project=other_project)
    assert "project" in e.value.details
    assert not ApiToken.objects.filter(user=user).exists()


def test_token_revoke_twice_changes_nothing():
    token, _ = services.token_create(user=UserFactory(), name="x")
    services.token_revoke(token=token)
    first = ApiToken.objects.get(pk=token.pk).revoked_at
    services.token_revoke(token=ApiToken.objects.get(pk=token.pk))
    assert ApiToken.objects.get(pk=token.pk).revoked_at == first
    assert _events("token.revoke").filter(object_id=str(token.pk)).count() == 1


def test_token_touch_writes_at_most_once_a_minute():
    token, _ = services.token_create(user=UserFactory(), name="x")
    now = timezone.now()
    services.token_touch(token=token, now=now)
    services.token_touch(token=token, now=now + timedelta(seconds=30))
    assert ApiToken.objects.get(pk=token.pk).last_used_at == now
    services.token_touch(token=token, now=now + timedelta(seconds=61))
    assert ApiToken.objects.get(pk=token.pk).last_used_at == now + timedelta(seconds=61)
