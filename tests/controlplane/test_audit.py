"""controlplane/audit.py: every API write leaves an event, refused writes too; who reads it."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.test import RequestFactory

from controlplane import audit
from controlplane.choices import AuditOutcome, AuditSource
from controlplane.models import AuditEvent
from tenants import invitations
from tenants.choices import Role
from tenants.models import ApiToken, Invitation, Membership, SSHKey
from tests.factories import UserFactory, add_member, make_project

pytestmark = pytest.mark.django_db

PROJECTS = "/api/v1/projects/"


def _ssh_line():
    return (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def _latest(action):
    return AuditEvent.objects.filter(action=action).latest("id")


def _assert_api_success(event, actor, project=None, project_slug=None):
    assert event.actor == actor
    assert event.actor_name == actor.username
    assert event.source == AuditSource.API
    assert event.ip_address == "127.0.0.1"
    assert event.outcome == AuditOutcome.SUCCESS
    assert event.request_id
    assert event.project == project
    assert event.project_slug == (project_slug or (project.slug if project else ""))


# --- successful writes --------------------------------------------------------------------------


def test_project_writes_are_audited(client_for, staff):
    client = client_for(staff)
    assert client.post(PROJECTS, {"slug": "audited", "name": "A"}).status_code == 201
    event = _latest("project.create")
    _assert_api_success(event, staff, event.project, "audited")
    assert event.project.slug == "audited"
    project = event.project
    assert client.patch(f"{PROJECTS}audited/", {"name": "B"}).status_code == 200
    _assert_api_success(_latest("project.update"), staff, project)
    assert client.delete(f"{PROJECTS}audited/").status_code == 204
    # the project is gone; its slug stays in the trail
    _assert_api_success(_latest("project.delete"), staff, None, "audited")


def test_invitation_and_membership_writes_are_audited(client_for, project):
    client = client_for(project.owner)
    invitations_url = f"{PROJECTS}{project.slug}/invitations/"
    made = client.post(invitations_url, {"email": "gone@uni.example.ac.jp", "role": "reader"})
    assert made.status_code == 201
    event = _latest("invitation.create")
    _assert_api_success(event, project.owner, project)
    assert event.detail == {"role": "reader"}
    assert client.delete(f"{invitations_url}{made.json()['id']}/").status_code == 204
    _assert_api_success(_latest("invitation.revoke"), project.owner, project)

    newcomer = UserFactory()
    _invitation, secret = invitations.invitation_create(
        project=project, email=newcomer.email, actor=project.owner
    )
    accepted = client_for(newcomer).post("/api/v1/invitations/accept/", {"token": secret})
    assert accepted.status_code == 200
    event = _latest("invitation.accept")
    _assert_api_success(event, newcomer, project)
    assert event.detail == {"role": "member"}
    url = f"{PROJECTS}{project.slug}/members/"
    assert client.patch(f"{url}{newcomer.username}/", {"role": "admin"}).status_code == 200
    _assert_api_success(_latest("membership.update"), project.owner, project)
    assert client.delete(f"{url}{newcomer.username}/").status_code == 204
    _assert_api_success(_latest("membership.remove"), project.owner, project)


def test_token_and_ssh_key_writes_are_audited(client_for, project):
    user = project.owner
    client = client_for(user)
    created = client.post("/api/v1/user/tokens/", {"name": "ci", "project": project.slug})
    assert created.status_code == 201
    _assert_api_success(_latest("token.create"), user, project)
    assert client.delete(f"/api/v1/user/tokens/{created.json()['id']}/").status_code == 204
    event = _latest("token.revoke")
    _assert_api_success(event, user, project)
    assert event.object_id == str(created.json()["id"])
    assert ApiToken.objects.get(pk=created.json()["id"]).revoked_at is not None

    key = client.post("/api/v1/user/ssh-keys/", {"public_key": _ssh_line()})
    assert key.status_code == 201
    event = _latest("sshkey.add")
    _assert_api_success(event, user)  # a user's key belongs to no project
    assert event.detail == {"fingerprint": key.json()["fingerprint"]}
    assert client.delete(f"/api/v1/user/ssh-keys/{key.json()['id']}/").status_code == 204
    _assert_api_success(_latest("sshkey.delete"), user)
    assert not SSHKey.objects.exists()


def test_operator_writes_are_audited(client_for, staff, project):
    client = client_for(staff)
    owner = UserFactory()
    body = {"slug": "by-operator", "name": "A", "owner": owner.username}
    assert client.post("/api/v1/admin/projects/", body).status_code == 201
    created = _latest("project.create")
    _assert_api_success(created, staff, created.project, "by-operator")
    url = f"/api/v1/admin/projects/{project.slug}/"
    assert client.patch(url, {"status": "suspended"}).status_code == 200
    _assert_api_success(_latest("project.set_status"), staff, project)
    assert client.patch(f"{url}quota/", {"vms": 3}).status_code == 200
    event = _latest("quota.update")
    _assert_api_success(event, staff, project)
    assert event.detail["vms"]["to"] == 3


def test_request_id_and_forwarded_address_are_recorded(client_for, project, settings):
    settings.TRUSTED_PROXY_COUNT = 1
    client = client_for(project.owner)
    response = client.post(
        f"{PROJECTS}{project.slug}/invitations/",
        {"email": "someone@uni.example.ac.jp"},
        HTTP_X_REQUEST_ID="req-abc",
        HTTP_X_FORWARDED_FOR="198.51.100.9, 203.0.113.5",
    )
    assert response.status_code == 201
    assert response["X-Request-ID"] == "req-abc"
    event = _latest("invitation.create")
    assert (event.request_id, event.ip_address) == ("req-abc", "203.0.113.5")


# --- refused writes -----------------------------------------------------------------------------


def test_a_readers_refused_write_is_audited_as_denied(client_for, users_by_role, project):
    reader = users_by_role[Role.READER]
    newcomer = UserFactory()
    response = client_for(reader).post(
        f"{PROJECTS}{project.slug}/invitations/", {"email": newcomer.email}
    )
    assert response.status_code == 403
    event = AuditEvent.objects.filter(outcome=AuditOutcome.DENIED).get()
    assert event.action == "invitation.create"
    assert event.actor == reader
    assert event.actor_name == reader.username
    assert event.project == project
    assert (event.source, event.ip_address) == (AuditSource.API, "127.0.0.1")
    assert event.detail["status"] == 403
    assert not Invitation.objects.exists()


def test_a_conflict_is_audited_as_failed(client_for, project):
    url = f"{PROJECTS}{project.slug}/members/{project.owner.username}/"
    response = client_for(project.owner).delete(url)
    assert response.status_code == 409
    event = AuditEvent.objects.filter(outcome=AuditOutcome.FAILED).get()
    assert event.action == "membership.destroy"
    assert event.actor == project.owner
    assert event.project == project
    assert event.object_id == project.owner.username
    assert event.detail == {
        "status": 409,
        "code": "last_owner",
        "message": "a project keeps at least one owner",
    }
    assert not AuditEvent.objects.filter(action="membership.remove").exists()


def test_an_anonymous_write_is_not_audited(client_for, project):
    anonymous = client_for(None)
    before = AuditEvent.objects.count()
    response = anonymous.post(f"{PROJECTS}{project.slug}/invitations/", {"email": "x@y.example"})
    assert response.status_code == 401
    assert AuditEvent.objects.count() == before


def test_a_refused_read_is_not_audited(client_for, project):
    outsider = client_for(UserFactory())
    before = AuditEvent.objects.count()
    assert outsider.get(f"{PROJECTS}{project.slug}/members/").status_code == 404
    assert AuditEvent.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_the_refusal_survives_the_rollback_of_the_write(client_for):
    project = make_project()
    admin = add_member(project, role=Role.ADMIN)
    second_owner = add_member(project, role=Role.OWNER)
    # an admin may not remove an owner: the service raises after locking rows, the
    # transaction rolls back, and the refusal is still committed
    url = f"{PROJECTS}{project.slug}/members/{second_owner.username}/"
    response = client_for(admin).delete(url)
    assert response.status_code == 403
    assert Membership.objects.filter(project=project, user=second_owner).exists()
    event = AuditEvent.objects.get(outcome=AuditOutcome.DENIED)
    assert (event.action, event.actor, event.project) == ("membership.destroy", admin, project)


# --- reading the trail --------------------------------------------------------------------------


def test_members_even_readers_read_their_projects_trail(
    client_for, users_by_role, project, other_project
):
    audit.record("test.elsewhere", other_project, project=other_project)
    response = client_for(users_by_role[Role.READER]).get(f"{PROJECTS}{project.slug}/audit-events/")
    assert response.status_code == 200
    results = response.json()["results"]
    assert results
    assert {e["project"] for e in results} == {project.slug}
    assert "membership.add" in {e["action"] for e in results}
    assert "test.elsewhere" not in {e["action"] for e in results}


def test_the_trail_filters_by_action_and_outcome(client_for, project):
    client = client_for(project.owner)
    url = f"{PROJECTS}{project.slug}/audit-events/"
    client.delete(f"{PROJECTS}{project.slug}/members/{project.owner.username}/")  # refused
    failed = client.get(url, {"outcome": "failed"}).json()["results"]
    assert [e["action"] for e in failed] == ["membership.destroy"]
    added = client.get(url, {"action": "membership."}).json()["results"]
    assert added and all(e["action"].startswith("membership.") for e in added)


def test_staff_read_the_whole_trail(client_for, staff, project, other_project):
    response = client_for(staff).get("/api/v1/admin/audit-events/", {"page_size": 500})
    assert response.status_code == 200
    slugs = {e["project"] for e in response.json()["results"]}
    assert {project.slug, other_project.slug} <= slugs
    one = (
        client_for(staff)
        .get("/api/v1/admin/audit-events/", {"project": other_project.slug})
        .json()["results"]
    )
    assert one and {e["project"] for e in one} == {other_project.slug}


def test_non_staff_get_403_on_the_whole_trail(client_for, project):
    response = client_for(project.owner).get("/api/v1/admin/audit-events/")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


# --- the context --------------------------------------------------------------------------------


def test_record_outside_a_request_is_the_systems(project):
    event = audit.record("test.system", project, project=project, detail={"why": "cron"})
    assert (event.actor, event.actor_name, event.source) == (None, "system", AuditSource.SYSTEM)
    assert (event.object_type, event.object_id) == ("tenants.project", str(project.pk))
    assert event.object_repr == project.slug


def test_a_record_reads_back_from_the_database_as_it_was_written(project):
    user = UserFactory(username="writer")
    context = {"ip_address": "2001:db8::7", "request_id": "req-7", "source": AuditSource.API}
    with audit.audit_context(actor=user, **context):
        event = audit.record(
            "test.write",
            project,
            project=project,
            outcome=AuditOutcome.FAILED,
            detail={"changed": ["name"], "n": 3, "nested": {"none": None, "text": "ä"}},
        )
    stored = AuditEvent.objects.get(pk=event.pk)
    columns = [field.attname for field in AuditEvent._meta.concrete_fields]
    assert [getattr(stored, c) for c in columns] == [getattr(event, c) for c in columns]
    assert (stored.actor_id, stored.actor_name, stored.ip_address) == (
        user.pk,
        "writer",
        "2001:db8::7",
    )
    assert stored.detail == {"changed": ["name"], "n": 3, "nested": {"none": None, "text": "ä"}}
    assert stored.at is not None and not event._state.adding
    second = audit.record("test.write", project)
    assert second.pk > event.pk and second.project_id is None


def test_audit_context_nests_and_restores():
    with audit.audit_context(source=AuditSource.CONTROLLER, request_id="outer"):
        with audit.audit_context(ip_address="192.0.2.1"):
            inner = audit.current()
        assert audit.current().ip_address is None
    assert (inner.source, inner.request_id, inner.ip_address) == (
        AuditSource.CONTROLLER,
        "outer",
        "192.0.2.1",
    )
    assert audit.current() == audit.AuditContext()


@pytest.mark.parametrize(
    ("hops", "forwarded", "remote", "expected"),
    [
        (0, "198.51.100.1", "10.0.0.1", "10.0.0.1"),  # no trusted proxy: the socket peer
        (1, "198.51.100.1, 203.0.113.2", "10.0.0.1", "203.0.113.2"),
        (2, "198.51.100.1, 203.0.113.2", "10.0.0.1", "198.51.100.1"),
        (2, "203.0.113.2", "10.0.0.1", "10.0.0.1"),  # fewer hops than proxies: the peer
        (1, "not-an-address", "10.0.0.1", None),
        (0, "", "2001:db8::0001", "2001:db8::1"),
    ],
)
def test_client_ip(settings, hops, forwarded, remote, expected):
    settings.TRUSTED_PROXY_COUNT = hops
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    assert audit.client_ip(request) == expected


@pytest.mark.parametrize(
    ("path", "source"),
    [("/api/v1/projects/", "api"), ("/admin/", "admin"), ("/login/", "portal")],
)
def test_source_for_path(path, source):
    assert audit.source_for_path(path) == source


@pytest.mark.embedded
def test_a_batch_of_records_is_written_at_its_end_in_one_insert(django_assert_num_queries):
    """Inside ``audit.batched`` records are kept and written at the block's end, in the
    order they were made, in one statement; a block inside it is the outer one's; a block
    that raises writes none of its records."""
    project = make_project()
    before = AuditEvent.objects.count()
    with django_assert_num_queries(1), audit.batched():
        first = audit.record("test.batch.first", project, project=project)
        with audit.batched():
            second = audit.record("test.batch.second", project, project=project)
        assert first.pk is None and second.pk is None  # not written yet
    assert first.pk < second.pk
    assert list(
        AuditEvent.objects.filter(pk__in=[first.pk, second.pk])
        .order_by("pk")
        .values_list("action", flat=True)
    ) == ["test.batch.first", "test.batch.second"]
    with pytest.raises(RuntimeError), audit.batched():
        audit.record("test.batch.lost", project, project=project)
        raise RuntimeError("the change they were about failed")
    assert AuditEvent.objects.count() == before + 2
    assert audit.record("test.batch.after", project).pk is not None  # outside: written at once
