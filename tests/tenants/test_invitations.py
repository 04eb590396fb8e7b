"""Invitations: the answer is the same whether or not an account has the address, nothing
about other users leaks, the invitee becomes a member only by accepting (after logging
in), another user cannot accept unless the operator allows it, expiry and revocation."""

from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from tenants import invitations
from tenants.choices import Role
from tenants.models import Invitation, Membership
from tests.factories import UserFactory
from tests.isolation import ProjectEndpointContract

pytestmark = pytest.mark.django_db


def url(project):
    return f"/api/v1/projects/{project.slug}/invitations/"


def _comparable(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "email", "expires_at", "created_at")}


def test_the_answer_is_identical_for_existing_and_unknown_addresses(
    client_for, project, django_capture_on_commit_callbacks
):
    UserFactory(email="known@uni.example.ac.jp")
    admin = client_for(project.owner)
    with django_capture_on_commit_callbacks(execute=True):
        known = admin.post(url(project), {"email": "known@uni.example.ac.jp"}, format="json")
        unknown = admin.post(url(project), {"email": "nobody@uni.example.ac.jp"}, format="json")
    assert known.status_code == unknown.status_code == 201
    assert _comparable(known.json()) == _comparable(unknown.json())
    assert set(known.json()) == set(unknown.json())
    assert "token" not in known.json()
    # both get the same mail, with a link; nobody is a member yet
    assert sorted(m.to[0] for m in mail.outbox) == [
        "known@uni.example.ac.jp",
        "nobody@uni.example.ac.jp",
    ]
    assert Membership.objects.filter(project=project).count() == 1


def test_bad_input_names_the_field(client_for, project):
    response = client_for(project.owner).post(url(project), {"email": "x"}, format="json")
    assert response.status_code == 400 and "email" in response.json()["details"]


def test_only_owners_invite_owners(client_for, users_by_role, project):
    payload = {"email": "boss@uni.example.ac.jp", "role": "owner"}
    refused = client_for(users_by_role[Role.ADMIN]).post(url(project), payload, format="json")
    assert refused.status_code == 403
    assert not Invitation.objects.exists()
    assert client_for(project.owner).post(url(project), payload, format="json").status_code == 201


def test_the_invitee_accepts_after_logging_in(client_for, project):
    invitee = UserFactory(email="Ken@Uni.example.ac.jp")
    _inv, secret = invitations.invitation_create(
        project=project, email="ken@uni.example.ac.jp", role=Role.READER, actor=project.owner
    )
    anonymous = client_for(None).post("/api/v1/invitations/accept/", {"token": secret})
    assert anonymous.status_code == 401
    accepted = client_for(invitee).post(
        "/api/v1/invitations/accept/", {"token": secret}, format="json"
    )
    assert accepted.status_code == 200
    assert accepted.json() == {"project": project.slug, "role": Role.READER}
    assert Membership.objects.get(project=project, user=invitee).role == Role.READER
    again = client_for(invitee).post("/api/v1/invitations/accept/", {"token": secret})
    assert again.status_code == 409


def test_another_user_cannot_accept_unless_allowed(client_for, project, settings):
    _inv, secret = invitations.invitation_create(
        project=project, email="ken@uni.example.ac.jp", actor=project.owner
    )
    other = UserFactory(email="mallory@elsewhere.example")
    refused = client_for(other).post("/api/v1/invitations/accept/", {"token": secret})
    assert refused.status_code == 403
    assert not Membership.objects.filter(project=project, user=other).exists()
    settings.INVITATION_ANY_ADDRESS = True
    allowed = client_for(other).post("/api/v1/invitations/accept/", {"token": secret})
    assert allowed.status_code == 200


def test_expired_and_revoked_invitations_cannot_be_accepted(client_for, project):
    invitee = UserFactory(email="ken@uni.example.ac.jp")
    expired, secret = invitations.invitation_create(
        project=project, email=invitee.email, actor=project.owner
    )
    Invitation.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(1))
    response = client_for(invitee).post("/api/v1/invitations/accept/", {"token": secret})
    assert response.status_code == 409 and "expired" in response.json()["message"]
    revoked, secret2 = invitations.invitation_create(
        project=project, email=invitee.email, actor=project.owner
    )
    delete = client_for(project.owner).delete(f"{url(project)}{revoked.pk}/")
    assert delete.status_code == 204
    response = client_for(invitee).post("/api/v1/invitations/accept/", {"token": secret2})
    assert response.status_code == 409 and "revoked" in response.json()["message"]
    listed = client_for(project.owner).get(url(project)).json()["results"]
    assert {i["status"] for i in listed} == {"expired", "revoked"}


def test_an_unknown_token_is_404(client_for):
    response = client_for(UserFactory()).post("/api/v1/invitations/accept/", {"token": "nope"})
    assert response.status_code == 404


def test_the_portal_link_accepts(project):
    invitee = UserFactory(email="ken@uni.example.ac.jp")
    _inv, secret = invitations.invitation_create(
        project=project, email=invitee.email, actor=project.owner
    )
    client = Client()
    client.force_login(invitee)
    page = client.get(f"/invitations/{secret}/")
    assert page.status_code == 200 and project.slug in page.content.decode()
    done = client.post(f"/invitations/{secret}/")
    assert done.status_code == 302
    assert Membership.objects.filter(project=project, user=invitee).exists()


class TestInvitationsIsolation(ProjectEndpointContract):
    basename = "project-invitation"
    read_role = Role.ADMIN
    write_role = Role.ADMIN
    actions = ("list", "retrieve", "create", "delete")
    create_references_nothing = True

    def make_object(self, project):
        return invitations.invitation_create(project=project, email="x@example.org")[0]

    def create_payload(self, project):
        return {"email": "new@example.org", "role": Role.MEMBER}

    def count(self, project):
        return Invitation.objects.for_project(project).count()
