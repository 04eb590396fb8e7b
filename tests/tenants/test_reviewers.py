"""Institutional reviewers: an operator designates a user as the reviewer of an institution,
named by its IdP's issuer; the reviewer sees and decides on exactly the applications of
applicants with an identity at that issuer (besides their own, which nobody reviews);
operators still review everything else. Designating and removing are operators' and
audited; the operators' API, its filters and strict fields."""

import pytest
from django.contrib.admin.sites import site
from django.urls import reverse

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput, PermissionDenied
from controlplane.models import AuditEvent
from tenants import applications, reviewers, selectors
from tenants.identities import FederatedProfile, federated_login
from tenants.models import InstitutionReviewer, Project, ProjectApplication
from tests.factories import UserFactory, make_project

pytestmark = pytest.mark.django_db

X = "https://idp.x-univ.ac.jp/idp/shibboleth"
Y = "https://idp.y-univ.ac.jp/idp/shibboleth"
URL = "/api/v1/applications/"
ADMIN = "/api/v1/admin/institution-reviewers/"


def person(issuer: str, subject: str, organisation: str = "X University"):
    """A user made the way a first SAML login makes one, with an identity at ``issuer``
    (in an audit context of its own: a login names its user the actor)."""
    profile = FederatedProfile(
        kind="saml", issuer=issuer, subject=subject, email=subject, organisation=organisation
    )
    with audit.audit_context():
        return federated_login(profile=profile)


def apply(applicant, slug: str) -> ProjectApplication:
    return applications.application_submit(
        applicant=applicant, slug=slug, title=f"Title {slug}", purpose="Research.", gpus=1
    )


@pytest.fixture
def world(staff):
    """A reviewer for X (who logs in at X too); applicants at X, at Y, with no federated
    identity, and one at both X and Y; an application each; and the reviewer's own."""
    reviewer = person(X, "rev@x-univ.ac.jp")
    reviewers.reviewer_designate(user=reviewer, issuer=X, actor=staff)
    at_x = person(X, "xan@x-univ.ac.jp")
    # Y's IdP releases X's name: the organisation never decides anything
    at_y = person(Y, "yui@y-univ.ac.jp", organisation="X University")
    local = UserFactory(organisation="X University")
    both = person(Y, "bo@y-univ.ac.jp")
    both.external_identities.create(kind="saml", issuer=X, subject="bo@x-univ.ac.jp")
    return {
        "reviewer": reviewer,
        "x": apply(at_x, "from-x"),
        "y": apply(at_y, "from-y"),
        "local": apply(local, "from-local"),
        "both": apply(both, "from-both"),
        "own": apply(reviewer, "from-reviewer"),
    }


def test_a_reviewer_of_x_approves_an_application_from_x(client_for, world):
    api = client_for(world["reviewer"])
    answer = api.post(f"{URL}{world['x'].pk}/review/", {"decision": "approve"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == "approved"
    assert answer.json()["reviewed_by"] == world["reviewer"].username
    assert Project.objects.get(slug="from-x").owner == world["x"].applicant
    event = AuditEvent.objects.get(action="application.approve")
    assert event.actor == world["reviewer"]
    assert event.detail["as"] == f"reviewer of {X}"
    # an applicant with identities at X and Y: X's reviewer decides too
    back = api.post(
        f"{URL}{world['both'].pk}/review/", {"decision": "return", "comment": "fewer GPUs"}
    )
    assert back.status_code == 200 and back.json()["state"] == "returned"


def test_the_service_refuses_others_with_a_clear_403(world):
    reviewer = world["reviewer"]
    for name, says in [
        ("y", "the applicant has no identity there"),
        ("local", "no federated identity"),
        ("own", "your own application"),
    ]:
        with pytest.raises(PermissionDenied) as refused:
            applications.application_review(
                application=world[name], reviewer=reviewer, decision="approve"
            )
        assert refused.value.status == 403
        assert says in refused.value.message, (name, refused.value.message)
        if name == "y":
            assert X in refused.value.message  # says which institution they review for
        world[name].refresh_from_db()
        assert world[name].state == "submitted"
    nobody = UserFactory()
    with pytest.raises(PermissionDenied, match="you are neither"):
        applications.application_review(application=world["x"], reviewer=nobody, decision="reject")


def test_the_api_answers_404_for_applications_the_reviewer_may_not_see(client_for, world):
    """Another applicant's application outside the reviewer's institutions is not theirs to
    see: 404 like a missing one, on every route; their own is visible and refused 403."""
    api = client_for(world["reviewer"])
    missing = api.get(f"{URL}999999999/")
    assert missing.status_code == 404
    for name in ("y", "local"):
        pk = world[name].pk
        for response in (
            api.get(f"{URL}{pk}/"),
            api.post(f"{URL}{pk}/review/", {"decision": "approve"}, format="json"),
            api.patch(f"{URL}{pk}/", {"gpus": 2}, format="json"),
            api.post(f"{URL}{pk}/withdraw/"),
        ):
            assert response.status_code == 404, (name, response.content)
            assert response.json() == missing.json()
        world[name].refresh_from_db()
        assert world[name].state == "submitted"
    own = api.post(f"{URL}{world['own'].pk}/review/", {"decision": "approve"}, format="json")
    assert own.status_code == 403
    assert own.json()["code"] == "permission_denied"
    assert "your own application" in own.json()["message"]


def test_a_reviewer_lists_their_own_and_those_they_review_and_nothing_else(
    client_for, world, staff
):
    ids = {a["id"] for a in client_for(world["reviewer"]).get(URL).json()["results"]}
    assert ids == {world["x"].pk, world["both"].pk, world["own"].pk}
    # a reviewer's view is not lent to a token scoped to one of their projects
    project = make_project(owner=world["reviewer"])
    scoped = client_for(world["reviewer"], project=project).get(URL).json()["results"]
    assert {a["id"] for a in scoped} == {world["own"].pk}
    scoped_review = client_for(world["reviewer"], project=project).post(
        f"{URL}{world['x'].pk}/review/", {"decision": "approve"}, format="json"
    )
    assert scoped_review.status_code == 404
    # applicants still see only their own; operators every one
    applicant = world["y"].applicant
    mine = client_for(applicant).get(URL).json()["results"]
    assert [a["id"] for a in mine] == [world["y"].pk]
    assert client_for(staff).get(URL).json()["count"] == 5


def test_removing_a_reviewer_ends_their_view(client_for, world, staff):
    row = InstitutionReviewer.objects.get(user=world["reviewer"])
    pk = row.pk
    reviewers.reviewer_remove(reviewer=row, actor=staff)
    ids = {a["id"] for a in client_for(world["reviewer"]).get(URL).json()["results"]}
    assert ids == {world["own"].pk}
    assert AuditEvent.objects.filter(action="reviewer.remove", object_id=str(pk)).exists()


def test_reviewable_and_visible_agree(world, staff):
    reviewer = world["reviewer"]
    reviewable = set(selectors.applications_reviewable_by(reviewer))
    assert reviewable == {world["x"], world["both"]}
    visible = {a.pk: a.may_review for a in selectors.applications_visible_to(reviewer)}
    assert visible == {world["x"].pk: True, world["both"].pk: True, world["own"].pk: False}
    # operators review every application but their own
    own = apply(staff, "from-staff")
    assert set(selectors.applications_reviewable_by(staff)) == {
        *(world[n] for n in ("x", "y", "local", "both", "own"))
    }
    with pytest.raises(PermissionDenied, match="your own application"):
        applications.application_review(application=own, reviewer=staff, decision="approve")
    done = applications.application_review(
        application=world["local"], reviewer=staff, decision="approve"
    )
    assert done.state == "approved"
    assert AuditEvent.objects.get(action="application.approve").detail["as"] == "operator"


# --- designating ----------------------------------------------------------------------------


def test_only_operators_designate_and_remove(client_for, staff):
    user, researcher = UserFactory(), UserFactory()
    with pytest.raises(PermissionDenied):
        reviewers.reviewer_designate(user=user, issuer=X, actor=researcher)
    api = client_for(researcher)
    refused = api.post(ADMIN, {"user": user.username, "issuer": X}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    assert api.get(ADMIN).status_code == 403
    row = reviewers.reviewer_designate(user=user, issuer=X, actor=staff)
    assert api.delete(f"{ADMIN}{row.pk}/").status_code == 403
    with pytest.raises(PermissionDenied):
        reviewers.reviewer_remove(reviewer=row, actor=researcher)
    assert InstitutionReviewer.objects.filter(pk=row.pk).exists()


def test_the_operators_api_designates_lists_and_removes(client_for, staff):
    user = UserFactory()
    api = client_for(staff)
    made = api.post(ADMIN, {"user": user.username, "issuer": f"  {X} "}, format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["user"], body["issuer"], body["created_by"]) == (user.username, X, staff.username)
    event = AuditEvent.objects.get(action="reviewer.designate")
    assert event.actor == staff and event.detail == {"user": user.username, "issuer": X}
    again = api.post(ADMIN, {"user": user.username, "issuer": X}, format="json")
    assert again.status_code == 409 and "user" in again.json()["details"]
    api.post(ADMIN, {"user": user.username, "issuer": Y}, format="json")
    assert api.get(ADMIN).json()["count"] == 2
    assert api.get(ADMIN, {"issuer": Y}).json()["count"] == 1
    assert api.get(ADMIN, {"user": user.username}).json()["count"] == 2
    assert api.get(ADMIN, {"user": "nobody"}).json()["count"] == 0
    assert api.get(f"{ADMIN}{body['id']}/").json()["issuer"] == X
    assert api.delete(f"{ADMIN}{body['id']}/").status_code == 204
    assert api.get(ADMIN).json()["count"] == 1
    assert AuditEvent.objects.filter(action="reviewer.remove", object_id=str(body["id"])).exists()


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"issuer": X}, "user"),
        ({"user": "no-such-user", "issuer": X}, "user"),
        ({"user": 7, "issuer": X}, "user"),
        ({"issuer": 12}, "issuer"),  # a number for a text field: strict, not its digits
        ({"issuer": "X University"}, "issuer"),  # an organisation's name is not an issuer
        ({"issuer": ""}, "issuer"),
        ({"issuer": "https://" + "a" * 260}, "issuer"),
        ({}, "issuer"),
    ],
)
def test_bad_input_names_the_field(client_for, staff, payload, field):
    user = UserFactory()
    body = payload if field == "user" else {"user": user.username, **payload}
    answer = client_for(staff).post(ADMIN, body, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["details"], answer.json()
    assert not InstitutionReviewer.objects.exists()


def test_the_service_checks_its_input(staff):
    user = UserFactory()
    with pytest.raises(InvalidInput) as bad:
        reviewers.reviewer_designate(user=user, issuer="Example University", actor=staff)
    assert "issuer" in bad.value.details
    user.is_active = False
    user.save()
    with pytest.raises(Conflict):
        reviewers.reviewer_designate(user=user, issuer=X, actor=staff)
    # URNs are entity IDs too
    active = UserFactory()
    row = reviewers.reviewer_designate(user=active, issuer="urn:mace:example:idp", actor=staff)
    assert row.issuer == "urn:mace:example:idp"


def test_the_admin_console_adds_and_removes_through_the_service(client, staff):
    client.force_login(staff)
    assert InstitutionReviewer in site._registry
    user = UserFactory()
    add = reverse("admin:tenants_institutionreviewer_add")
    refused = client.post(add, {"user": user.pk, "issuer": "Example University"})
    assert refused.status_code == 200 and not InstitutionReviewer.objects.exists()
    assert client.post(add, {"user": user.pk, "issuer": X}).status_code == 302
    row = InstitutionReviewer.objects.get()
    assert row.created_by == staff
    assert AuditEvent.objects.filter(action="reviewer.designate").exists()
    assert client.get(reverse("admin:tenants_institutionreviewer_changelist")).status_code == 200
    change = reverse("admin:tenants_institutionreviewer_change", args=[row.pk])
    assert X in client.get(change).content.decode()
    twice = client.post(add, {"user": user.pk, "issuer": X})
    assert twice.status_code == 200 and InstitutionReviewer.objects.count() == 1
    delete = reverse("admin:tenants_institutionreviewer_delete", args=[row.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 302
    assert not InstitutionReviewer.objects.exists()
    assert AuditEvent.objects.filter(action="reviewer.remove").exists()
