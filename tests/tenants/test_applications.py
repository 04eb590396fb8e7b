"""Project applications: apply, return with comments, amend, approve into a project with the
quota asked and the applicant as owner; reject; renewal and quota increase; only operators
review; renewal reminders 30 and 7 days ahead, each once (a frozen clock)."""

from datetime import date, datetime, timedelta
from unittest import mock

import pytest
from django.core import mail
from django.utils import timezone

from controlplane.models import AuditEvent, Event
from tenants import applications, services
from tenants.choices import Role
from tenants.models import Project, ProjectApplication, RenewalReminder
from tests.factories import UserFactory, make_project

pytestmark = pytest.mark.django_db

URL = "/api/v1/applications/"
ASK = {
    "kind": "new",
    "slug": "protein-folding",
    "title": "Protein folding at scale",
    "purpose": "Train structure models on 8 GPUs.",
    "field": "biology",
    "vcpus": 96,
    "memory_gib": 768,
    "gpus": 8,
    "storage_gib": 4096,
    "global_ips": 1,
    "valid_from": "2027-01-01",
    "valid_until": "2027-12-31",
}


def test_apply_return_amend_approve(client_for, staff, django_capture_on_commit_callbacks):
    researcher = UserFactory(email="rin@uni.example.ac.jp")
    me, operator = client_for(researcher), client_for(staff)
    applied = me.post(URL, {**ASK, "gpus": 16}, format="json")
    assert applied.status_code == 201, applied.content
    app_url = f"{URL}{applied.json()['id']}/"
    assert applied.json()["state"] == "submitted"

    # a researcher cannot review, not even their own
    assert me.post(f"{app_url}review/", {"decision": "approve"}).status_code == 403
    # returning needs a comment, naming the field
    bad = operator.post(f"{app_url}review/", {"decision": "return"}, format="json")
    assert bad.status_code == 400 and "comment" in bad.json()["details"]
    with django_capture_on_commit_callbacks(execute=True):
        back = operator.post(
            f"{app_url}review/", {"decision": "return", "comment": "8 GPUs are enough"}
        )
    assert back.json()["state"] == "returned"
    assert back.json()["review_comment"] == "8 GPUs are enough"
    assert mail.outbox and mail.outbox[-1].to == ["rin@uni.example.ac.jp"]
    # a returned application cannot be approved before it is amended
    assert operator.post(f"{app_url}review/", {"decision": "approve"}).status_code == 409

    amended = me.patch(app_url, {"gpus": 8}, format="json")
    assert amended.status_code == 200 and amended.json()["state"] == "submitted"
    approved = operator.post(f"{app_url}review/", {"decision": "approve"}, format="json")
    assert approved.status_code == 200 and approved.json()["project"] == "protein-folding"

    project = Project.objects.get(slug="protein-folding")
    assert project.owner == researcher and services.role_of(researcher, project) == Role.OWNER
    assert project.valid_until == date(2027, 12, 31)
    limits = project.quota.limits()
    assert (limits["vcpus"], limits["memory_gib"], limits["gpus"]) == (96, 768, 8)
    assert (limits["storage_gib"], limits["global_ips"]) == (4096, 1)
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"application.submit", "application.return", "application.amend"} <= actions
    assert {"application.approve", "project.create"} <= actions
    assert Event.objects.filter(project=project, kind="application.approved").exists()
    # decided once: a second decision is a conflict
    assert operator.post(f"{app_url}review/", {"decision": "reject"}).status_code == 409


def test_reject_and_withdraw(client_for, staff):
    researcher = UserFactory()
    me = client_for(researcher)
    one = me.post(URL, ASK, format="json").json()
    rejected = client_for(staff).post(f"{URL}{one['id']}/review/", {"decision": "reject"})
    assert rejected.json()["state"] == "rejected"
    assert not Project.objects.filter(slug=ASK["slug"]).exists()
    two = me.post(URL, ASK, format="json").json()
    assert me.post(f"{URL}{two['id']}/withdraw/").json()["state"] == "withdrawn"


def test_bad_input_names_the_field(client_for):
    me = client_for(UserFactory())
    for change, field in [
        ({"slug": "Bad Slug"}, "slug"),
        ({"purpose": ""}, "purpose"),
        ({"valid_until": "2026-01-01"}, "valid_until"),
        ({"kind": "quota"}, "project"),
    ]:
        response = me.post(URL, {**ASK, **change}, format="json")
        assert response.status_code == 400, (change, response.content)
        assert field in response.json()["details"], (change, response.json())


def test_applicants_see_only_their_own(client_for, staff):
    alice, bob = UserFactory(), UserFactory()
    client_for(alice).post(URL, ASK, format="json")
    assert client_for(bob).get(URL).json()["count"] == 0
    assert client_for(staff).get(URL).json()["count"] == 1
    theirs = ProjectApplication.objects.get()
    assert client_for(bob).get(f"{URL}{theirs.pk}/").status_code == 404


def test_renewal_and_quota_increase(client_for, staff, project):
    owner = client_for(project.owner)
    renewal = owner.post(
        URL,
        {
            "kind": "renewal",
            "project": project.slug,
            "title": "Another year",
            "purpose": "Still folding.",
            "valid_until": "2030-03-31",
        },
        format="json",
    )
    assert renewal.status_code == 201, renewal.content
    client_for(staff).post(f"{URL}{renewal.json()['id']}/review/", {"decision": "approve"})
    project.refresh_from_db()
    assert project.valid_until == date(2030, 3, 31)
    more = owner.post(
        URL,
        {
            "kind": "quota",
            "project": project.slug,
            "title": "More GPUs",
            "purpose": "Bigger models.",
            "gpus": 32,
        },
        format="json",
    )
    client_for(staff).post(f"{URL}{more.json()['id']}/review/", {"decision": "approve"})
    project.quota.refresh_from_db()
    assert project.quota.gpus == 32
    # someone with no role in the project cannot apply for it
    stranger = client_for(UserFactory()).post(
        URL, {"kind": "quota", "project": project.slug, "title": "x", "purpose": "y", "gpus": 1}
    )
    assert stranger.status_code == 400 and "project" in stranger.json()["details"]


def test_a_renewal_ends_later_than_the_project(client_for, project):
    services.project_update(project=project, valid_until=date(2027, 3, 31))
    ask = {"kind": "renewal", "project": project.slug, "title": "t", "purpose": "p"}
    owner = client_for(project.owner)
    for until in ("2027-03-31", "2026-12-31"):
        refused = owner.post(URL, {**ask, "valid_until": until}, format="json")
        assert refused.status_code == 400
        assert "2027-03-31" in refused.json()["details"]["valid_until"][0]
    assert owner.post(URL, {**ask, "valid_until": "2027-04-01"}, format="json").status_code == 201


def test_renewal_reminders_go_once_each(django_capture_on_commit_callbacks):
    project = make_project()
    project.owner.email = "owner@uni.example.ac.jp"
    project.owner.save()
    services.project_update(project=project, valid_until=date(2027, 3, 31))

    def run(day: date):
        frozen = timezone.make_aware(datetime.combine(day, datetime.min.time()))
        with (
            mock.patch("django.utils.timezone.now", return_value=frozen),
            django_capture_on_commit_callbacks(execute=True),
        ):
            return applications.renewal_reminders_send()

    assert run(date(2027, 2, 20)) == []  # 39 days ahead: nothing yet
    assert run(date(2027, 3, 1)) == [(project.slug, 30)]  # 30 days
    assert run(date(2027, 3, 2)) == []  # not again
    assert run(date(2027, 3, 20)) == []  # 11 days: the 30-day one went already
    assert run(date(2027, 3, 24)) == [(project.slug, 7)]  # 7 days
    assert run(date(2027, 3, 30)) == []
    assert RenewalReminder.objects.count() == 2
    kinds = Event.objects.filter(project=project).values_list("kind", flat=True)
    assert list(kinds).count("project.renewal_reminder") == 2
    assert [m.to for m in mail.outbox].count(["owner@uni.example.ac.jp"]) == 2
    # a renewal moves the end: the new end gets its own reminders
    services.project_update(project=project, valid_until=date(2027, 3, 31) + timedelta(365))
    assert run(date(2028, 3, 1)) == [(project.slug, 30)]


def test_the_portal_applies_returns_amends_and_approves(staff):
    from django.test import Client

    researcher = UserFactory()
    me, operator = Client(), Client()
    me.force_login(researcher)
    operator.force_login(staff)
    form = {k: v for k, v in ASK.items() if k != "kind"}
    assert me.post("/applications/", form).status_code == 302
    application = ProjectApplication.objects.get()
    assert "Protein folding at scale" in operator.get("/applications/").content.decode()
    operator.post(
        f"/applications/{application.pk}/review/", {"decision": "return", "comment": "less"}
    )
    me.post(f"/applications/{application.pk}/amend/", {"gpus": "4"})
    operator.post(f"/applications/{application.pk}/review/", {"decision": "approve"})
    project = Project.objects.get(slug=ASK["slug"])
    assert project.owner == researcher and project.quota.gpus == 4
    # researchers cannot review from the portal either
    other = ProjectApplication.objects.create(applicant=researcher, title="t", purpose="p")
    me.post(f"/applications/{other.pk}/review/", {"decision": "approve"})
    other.refresh_from_db()
    assert other.state == "submitted"
