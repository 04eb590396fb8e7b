"""tenants/api/views.py: login, projects, members, quota, tokens and the operators' projects."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import quotas, services
from tenants.choices import ProjectStatus, Role
from tenants.models import ApiToken, Membership, Project, Quota
from tests.factories import UserFactory, add_member

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-staple"  # what UserFactory sets
PROJECTS = "/api/v1/projects/"
TOKENS = "/api/v1/user/tokens/"
LOGIN = "/api/v1/auth/login/"


def members_url(project, username=""):
    return f"{PROJECTS}{project.slug}/members/" + (f"{username}/" if username else "")


@pytest.fixture
def counters(monkeypatch):
    """A private copy of the usage counters: what a test registers is gone after it."""
    monkeypatch.setattr(quotas, "_counters", {k: list(v) for k, v in quotas._counters.items()})


# --- login --------------------------------------------------------------------------------------


def test_login_sets_a_session_and_returns_the_csrf_token():
    user = UserFactory()
    client = APIClient(enforce_csrf_checks=True)
    response = client.post(LOGIN, {"username": user.username, "password": PASSWORD})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["user"]["username"] == user.username
    assert body["csrf_token"]
    assert client.get("/api/v1/user/").json()["username"] == user.username


def test_login_with_a_wrong_password_is_400():
    user = UserFactory()
    response = APIClient().post(LOGIN, {"username": user.username, "password": "nope"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_credentials"


def test_session_writes_need_the_csrf_header():
    user = UserFactory()
    client = APIClient(enforce_csrf_checks=True)
    csrf = client.post(LOGIN, {"username": user.username, "password": PASSWORD}).json()[
        "csrf_token"
    ]
    without = client.post(TOKENS, {"name": "laptop"})
    assert without.status_code == 403
    assert without.json()["code"] == "permission_denied"
    assert "CSRF" in without.json()["message"]
    assert not ApiToken.objects.filter(user=user).exists()
    with_header = client.post(TOKENS, {"name": "laptop"}, HTTP_X_CSRFTOKEN=csrf)
    assert with_header.status_code == 201, with_header.content


def test_repeated_failed_logins_lock_the_address_out(settings):
    user = UserFactory()
    client = APIClient()
    limit = settings.AXES_FAILURE_LIMIT
    for attempt in range(1, limit + 1):
        response = client.post(LOGIN, {"username": user.username, "password": f"wrong{attempt}"})
        # the failure that reaches the limit is itself answered with the lock-out
        assert response.status_code == (429 if attempt == limit else 400), attempt
    locked = client.post(LOGIN, {"username": user.username, "password": PASSWORD})
    assert locked.status_code == 429
    assert locked.json()["code"] == "login_locked_out"
    assert "_auth_user_id" not in client.session
    # the lock-out is per username and address: another address still logs in
    elsewhere = APIClient(REMOTE_ADDR="192.0.2.7")
    response = elsewhere.post(LOGIN, {"username": user.username, "password": PASSWORD})
    assert response.status_code == 200


def test_failed_logins_below_the_limit_do_not_lock_out(settings):
    user = UserFactory()
    client = APIClient()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post(LOGIN, {"username": user.username, "password": "x"}).status_code == 400
    assert client.post(LOGIN, {"username": user.username, "password": PASSWORD}).status_code == 200


def test_portal_login_page(project):
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200
    assert b'name="password"' in page.content
    wrong = client.post("/login/", {"username": project.owner.username, "password": "no"})
    assert wrong.status_code == 200
    assert b"Wrong username or password" in wrong.content
    response = client.post("/login/", {"username": project.owner.username, "password": PASSWORD})
    assert response.status_code == 302
    home = client.get(response["Location"])
    assert home.status_code == 200
    assert project.slug.encode() in home.content


# --- projects -----------------------------------------------------------------------------------


def test_staff_creates_a_project_and_owns_it(client_for, staff):
    response = client_for(staff).post(PROJECTS, {"slug": "climate", "name": "Climate"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["slug"], body["owner"], body["my_role"]) == ("climate", staff.username, "owner")
    assert response["Location"] == body["url"]
    assert services.role_of(staff, Project.objects.get(slug="climate")) == Role.OWNER


def test_non_staff_cannot_create_a_project(client_for, settings):
    settings.SELF_SERVICE_PROJECTS = False
    response = client_for(UserFactory()).post(PROJECTS, {"slug": "mine", "name": "Mine"})
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert not Project.objects.filter(slug="mine").exists()


def test_self_service_lets_anyone_create_a_project_and_own_it(client_for, settings):
    settings.SELF_SERVICE_PROJECTS = True
    user = UserFactory()
    response = client_for(user).post(PROJECTS, {"slug": "mine", "name": "Mine"})
    assert response.status_code == 201, response.content
    project = Project.objects.get(slug="mine")
    assert project.owner == user
    assert services.role_of(user, project) == Role.OWNER


@pytest.mark.parametrize("slug", ["No_Caps", "x", "-lead", "trail-"])
def test_create_project_invalid_slug_is_400_naming_slug(client_for, staff, slug):
    response = client_for(staff).post(PROJECTS, {"slug": slug, "name": "x"})
    assert response.status_code == 400
    assert "slug" in response.json()["details"]


def test_create_project_duplicate_slug_is_409(client_for, staff, project):
    response = client_for(staff).post(PROJECTS, {"slug": project.slug, "name": "again"})
    assert response.status_code == 409
    assert response.json()["details"] == {"slug": ["taken"]}


def test_project_list_shows_the_callers_projects_with_their_role(
    client_for, project, other_project
):
    user = add_member(project, role=Role.READER)
    add_member(other_project, user, role=Role.ADMIN)
    add_member(other_project)  # another member must not duplicate the row
    results = client_for(user).get(PROJECTS).json()["results"]
    assert {(p["slug"], p["my_role"]) for p in results} == {
        (project.slug, "reader"),
        (other_project.slug, "admin"),
    }
    assert len(results) == 2


def test_admin_edits_the_project_but_cannot_change_its_slug(client_for, users_by_role, project):
    admin = client_for(users_by_role[Role.ADMIN])
    slug = project.slug
    response = admin.patch(f"{PROJECTS}{slug}/", {"name": "Renamed", "slug": "other"})
    assert response.status_code == 200, response.content
    assert response.json()["slug"] == slug
    project.refresh_from_db()
    assert (project.name, project.slug) == ("Renamed", slug)
    member = client_for(users_by_role[Role.MEMBER])
    assert member.patch(f"{PROJECTS}{project.slug}/", {"name": "x"}).status_code == 403


def test_owner_deletes_an_empty_project_admin_cannot(client_for, users_by_role, project):
    url = f"{PROJECTS}{project.slug}/"
    response = client_for(users_by_role[Role.ADMIN]).delete(url)
    assert response.status_code == 403
    assert Project.objects.filter(pk=project.pk).exists()
    assert client_for(project.owner).delete(url).status_code == 204
    assert not Project.objects.filter(pk=project.pk).exists()


def test_deleting_a_project_with_resources_is_409(client_for, project, counters):
    quotas.register_usage("networks", lambda p: 1)
    response = client_for(project.owner).delete(f"{PROJECTS}{project.slug}/")
    assert response.status_code == 409
    assert response.json()["code"] == "project_not_empty"
    assert response.json()["details"] == {"usage": {"networks": 1}}
    assert Project.objects.filter(pk=project.pk).exists()


def test_quota_endpoint_reports_usage_from_what_exists(
    client_for, users_by_role, project, counters
):
    quotas.register_usage("vcpus", lambda p: 6 if p.pk == project.pk else 0)
    services.quota_set(project=project, vcpus=10)
    report = client_for(users_by_role[Role.READER]).get(f"{PROJECTS}{project.slug}/quota/")
    assert report.status_code == 200
    assert report.json()["vcpus"] == {"limit": 10, "used": 6, "available": 4}


# --- members ------------------------------------------------------------------------------------


def test_members_cannot_be_added_by_name_only_invited(client_for, users_by_role, project):
    """No POST on members: naming a username or an address would tell an admin whether it
    has an account. People come in by invitation (tests/tenants/test_invitations.py)."""
    newcomer = UserFactory()
    for role in (Role.ADMIN, Role.OWNER):
        for user in (newcomer.username, newcomer.email, "ghost"):
            response = client_for(users_by_role[role]).post(
                members_url(project), {"user": user, "role": "reader"}
            )
            assert response.status_code == 405, response.content
            assert response.json()["code"] == "method_not_allowed"
    assert services.role_of(newcomer, project) is None


def test_admin_cannot_grant_owner_but_an_owner_can(client_for, users_by_role, project):
    promote = {"role": "owner"}
    member = users_by_role[Role.MEMBER]
    response = client_for(users_by_role[Role.ADMIN]).patch(
        members_url(project, member.username), promote
    )
    assert response.status_code == 403
    response = client_for(project.owner).patch(members_url(project, member.username), promote)
    assert response.status_code == 200
    assert services.role_of(member, project) == Role.OWNER


def test_last_owner_cannot_be_removed_or_demoted(client_for, project):
    client = client_for(project.owner)
    url = members_url(project, project.owner.username)
    for response in (client.delete(url), client.patch(url, {"role": "admin"})):
        assert response.status_code == 409
        assert response.json()["code"] == "last_owner"
    assert services.role_of(project.owner, project) == Role.OWNER


def test_member_cannot_manage_members(client_for, users_by_role, project):
    member = client_for(users_by_role[Role.MEMBER])
    reader = users_by_role[Role.READER]
    assert member.patch(members_url(project, reader.username), {"role": "admin"}).status_code == 403
    assert member.delete(members_url(project, reader.username)).status_code == 403
    assert services.role_of(reader, project) == Role.READER


def test_removing_a_member_revokes_their_tokens_for_that_project(client_for, project):
    leaving = add_member(project)
    scoped = client_for(leaving, project)
    unscoped = client_for(leaving)
    assert scoped.get(PROJECTS).status_code == 200
    response = client_for(project.owner).delete(members_url(project, leaving.username))
    assert response.status_code == 204
    after = scoped.get(PROJECTS)
    assert after.status_code == 401
    assert after.json()["message"] == "This token was revoked."
    assert unscoped.get(PROJECTS).json()["results"] == []  # still a user, no longer a member


# --- tokens -------------------------------------------------------------------------------------


def test_token_secret_is_shown_once(client_for):
    user = UserFactory()
    client = client_for(user)
    created = client.post(TOKENS, {"name": "laptop"})
    assert created.status_code == 201
    secret = created.json()["token"]
    token = ApiToken.objects.get(pk=created.json()["id"])
    assert token.digest == services.token_digest(secret) != secret
    listed = client.get(TOKENS)
    detail = client.get(f"{TOKENS}{token.pk}/")
    assert (listed.status_code, detail.status_code) == (200, 200)
    assert detail.json()["prefix"] == token.prefix
    for item in [*listed.json()["results"], detail.json()]:
        assert "token" not in item
    assert secret not in listed.content.decode() + detail.content.decode()
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert fresh.get("/api/v1/user/").json()["username"] == user.username


def test_a_blank_project_slug_is_a_400_not_an_unscoped_token(client_for):
    response = client_for(UserFactory()).post(
        TOKENS, {"name": "laptop", "project": ""}, format="json"
    )
    assert response.status_code == 400
    assert "project" in response.json()["details"]
    assert not ApiToken.objects.filter(name="laptop").exists()


def test_an_expired_token_is_401_saying_so(client_for):
    user = UserFactory()
    expires = (timezone.now() + timedelta(days=1)).isoformat()
    created = client_for(user).post(TOKENS, {"name": "short", "expires_at": expires})
    assert created.status_code == 201, created.content
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.json()['token']}")
    assert client.get("/api/v1/user/").status_code == 200
    ApiToken.objects.filter(pk=created.json()["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = client.get("/api/v1/user/")
    assert response.status_code == 401
    assert response.json()["message"] == "This token has expired."


def test_a_past_expiry_is_refused(client_for):
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    response = client_for(UserFactory()).post(TOKENS, {"name": "x", "expires_at": past})
    assert response.status_code == 400
    assert "expires_at" in response.json()["details"]


def test_a_revoked_token_is_401_and_stays_listed(client_for):
    user = UserFactory()
    victim = client_for(user)
    token = ApiToken.objects.filter(user=user).get()
    assert victim.get("/api/v1/user/").status_code == 200
    manager = client_for(user)
    assert manager.delete(f"{TOKENS}{token.pk}/").status_code == 204
    response = victim.get("/api/v1/user/")
    assert response.status_code == 401
    assert response.json()["message"] == "This token was revoked."
    listed = {t["id"]: t for t in manager.get(TOKENS).json()["results"]}
    assert listed[token.pk]["revoked_at"] is not None


@pytest.mark.parametrize(
    "header",
    ["Bearer kumo_nothere_secret", "Bearer not-a-kumo-token", "Bearer a b"],
)
def test_bad_tokens_are_401(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get(PROJECTS)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'


def test_a_token_with_a_tampered_secret_is_401(client_for):
    user = UserFactory()
    secret = client_for(user).post(TOKENS, {"name": "x"}).json()["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret[:-2]}xx")
    assert client.get("/api/v1/user/").status_code == 401


def test_token_use_records_last_used_at(client_for):
    user = UserFactory()
    client = client_for(user)
    token = ApiToken.objects.get(user=user)
    assert token.last_used_at is None
    before = timezone.now()
    client.get("/api/v1/user/")
    token.refresh_from_db()
    assert token.last_used_at is not None and token.last_used_at >= before


def test_a_scoped_token_sees_only_its_project(client_for, project, other_project):
    user = add_member(project)
    add_member(other_project, user)
    assert len(client_for(user).get(PROJECTS).json()["results"]) == 2
    scoped = client_for(user, project)
    results = scoped.get(PROJECTS).json()["results"]
    assert [p["slug"] for p in results] == [project.slug]
    assert scoped.get(f"{PROJECTS}{other_project.slug}/").status_code == 404
    assert scoped.get(members_url(other_project)).status_code == 404


def test_a_scoped_token_cannot_create_projects(client_for, staff, project):
    add_member(project, staff)
    response = client_for(staff, project).post(PROJECTS, {"slug": "sneaky", "name": "x"})
    assert response.status_code == 403
    assert "scoped" in response.json()["message"]
    assert not Project.objects.filter(slug="sneaky").exists()


def test_a_scoped_token_cannot_mint_a_token_with_a_wider_scope(client_for, project, other_project):
    user = add_member(project)
    add_member(other_project, user)
    scoped = client_for(user, project)
    for payload in ({"name": "all"}, {"name": "other", "project": other_project.slug}):
        response = scoped.post(TOKENS, payload)
        assert response.status_code == 403, (payload, response.content)
    assert ApiToken.objects.filter(user=user).count() == 1
    same = scoped.post(TOKENS, {"name": "same", "project": project.slug})
    assert same.status_code == 201


def test_scoping_a_token_to_a_project_you_are_not_in_is_400(client_for, other_project):
    user = UserFactory()
    response = client_for(user).post(TOKENS, {"name": "x", "project": other_project.slug})
    assert response.status_code == 400
    assert "project" in response.json()["details"]
    assert ApiToken.objects.filter(user=user).count() == 1  # only the client's own


def test_tokens_are_private_to_their_user(client_for):
    alice, bob = UserFactory(), UserFactory()
    client_for(alice)
    token = ApiToken.objects.get(user=alice)
    assert client_for(bob).delete(f"{TOKENS}{token.pk}/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


# --- operators ----------------------------------------------------------------------------------


def test_operator_creates_a_project_for_a_named_owner(client_for, staff):
    owner = UserFactory()
    response = client_for(staff).post(
        "/api/v1/admin/projects/", {"slug": "astro", "name": "Astro", "owner": owner.username}
    )
    assert response.status_code == 201, response.content
    project = Project.objects.get(slug="astro")
    assert project.owner == owner
    assert services.role_of(owner, project) == Role.OWNER
    assert services.role_of(staff, project) is None


def test_operator_suspends_a_project(client_for, staff, project):
    url = f"/api/v1/admin/projects/{project.slug}/"
    response = client_for(staff).patch(url, {"status": "suspended"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "suspended"
    project.refresh_from_db()
    assert project.status == ProjectStatus.SUSPENDED


def test_operator_cannot_change_the_owner_through_patch(client_for, staff, project):
    other = UserFactory()
    url = f"/api/v1/admin/projects/{project.slug}/"
    response = client_for(staff).patch(url, {"owner": other.username})
    assert response.status_code == 400
    assert "owner" in response.json()["details"]
    project.refresh_from_db()
    assert project.owner != other


def test_operator_sets_a_quota(client_for, staff, project):
    url = f"/api/v1/admin/projects/{project.slug}/quota/"
    response = client_for(staff).patch(url, {"gpus": 0, "vms": 40})
    assert response.status_code == 200, response.content
    assert response.json()["gpus"]["limit"] == 0
    assert response.json()["vms"]["limit"] == 40
    quota = Quota.objects.get(project=project)
    assert (quota.gpus, quota.vms) == (0, 40)
    assert client_for(staff).patch(url, {"gpus": -1}).status_code == 400


def test_non_staff_get_403_on_operator_endpoints(client_for, project):
    client = client_for(project.owner)  # even the project's owner
    base = "/api/v1/admin/projects/"
    assert client.get(base).status_code == 403
    new = {"slug": "x-new", "name": "x", "owner": project.owner.username}
    assert client.post(base, new).status_code == 403
    assert client.patch(f"{base}{project.slug}/", {"status": "suspended"}).status_code == 403
    assert client.patch(f"{base}{project.slug}/quota/", {"vms": 99}).status_code == 403
    project.refresh_from_db()
    assert project.status == ProjectStatus.ACTIVE
    assert Quota.objects.get(project=project).vms != 99
    assert not Project.objects.filter(slug="x-new").exists()


def test_membership_count_unchanged_by_refused_member_writes(client_for, users_by_role, project):
    before = Membership.objects.filter(project=project).count()
    reader = client_for(users_by_role[Role.READER])
    assert reader.post(members_url(project), {"user": UserFactory().username}).status_code == 403
    assert Membership.objects.filter(project=project).count() == before


def test_a_scoped_token_reads_but_does_not_change_the_accounts_ssh_keys(client_for, project):
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from tests.tenants.test_sshkeys import _openssh_public

    def ed25519_line():
        return _openssh_public(ed25519.Ed25519PrivateKey.generate(), "laptop")

    scoped = client_for(project.owner, project)
    assert scoped.get("/api/v1/user/ssh-keys/").status_code == 200
    response = scoped.post("/api/v1/user/ssh-keys/", {"public_key": ed25519_line()}, format="json")
    assert response.status_code == 403
    assert "scoped to one project" in response.json()["message"]
    assert (
        client_for(project.owner)
        .post("/api/v1/user/ssh-keys/", {"public_key": ed25519_line()}, format="json")
        .status_code
        == 201
    )


def test_a_scoped_token_revokes_only_tokens_of_its_project(client_for, project):
    from tenants.models import ApiToken

    owner = project.owner
    scoped = client_for(owner, project)
    client_for(owner)  # an unscoped token of the same user
    unscoped_token = ApiToken.objects.get(user=owner, project=None)
    own_token = ApiToken.objects.filter(user=owner, project=project).first()
    assert scoped.delete(f"/api/v1/user/tokens/{unscoped_token.pk}/").status_code == 403
    assert scoped.delete(f"/api/v1/user/tokens/{own_token.pk}/").status_code == 204
    unscoped_token.refresh_from_db()
    assert unscoped_token.revoked_at is None
