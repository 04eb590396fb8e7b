"""Applications in the portal: a project's owners and admins apply for a renewal or more
quota (only their projects are offered); bad input is a form error naming the field, never
a 500, and so is an amend with a number that is not one; reviewers see Approve / Return /
Reject on exactly the applications they may decide on, and nothing else of other people's.
(New-project applications: ``tests/tenants/test_applications.py``.)"""

import re
from datetime import date

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from controlplane import audit
from tenants import applications, reviewers
from tenants import services as tenants
from tenants.choices import Role
from tenants.identities import FederatedProfile, federated_login
from tenants.models import ProjectApplication
from tests.factories import UserFactory, add_member, make_project

pytestmark = pytest.mark.django_db

URL = "/applications/"
X = "https://idp.x-univ.ac.jp/idp/shibboleth"
Y = "https://idp.y-univ.ac.jp/idp/shibboleth"


def errors_of(response, field):
    html = response.content.decode()
    found = re.search(rf'<ul class="errorlist" role="alert" data-field="{field}">(.*?)</ul>', html)
    return found.group(1) if found else ""


def said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def review_forms(response) -> set[int]:
    """The ids of the applications the page offers review buttons for."""
    html = response.content.decode()
    return {int(pk) for pk in re.findall(r'action="/applications/(\d+)/review/"', html)}


def listed(response) -> set[int]:
    return {int(pk) for pk in re.findall(r'data-id="(\d+)"', response.content.decode())}


def person(issuer, subject):
    with audit.audit_context():
        return federated_login(
            profile=FederatedProfile(kind="saml", issuer=issuer, subject=subject)
        )


# --- renewal and quota increase -----------------------------------------------------------------


def test_an_admin_applies_for_a_renewal_and_more_quota(login, staff, project):
    tenants.project_update(project=project, valid_until=date(2027, 3, 31))
    admin = add_member(project, role=Role.ADMIN)
    me = login(admin)
    page = me.get(URL, {"project": project.slug, "kind": "renewal"})
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="project-application"' in html
    assert f'<option value="{project.slug}" selected>' in html

    renewal = {"apply": "project", "kind": "renewal", "project": project.slug}
    answer = me.post(URL, {**renewal, "purpose": "Another year", "valid_until": "2028-03-31"})
    assert answer.status_code == 302, answer.content.decode()
    made = ProjectApplication.objects.get(kind="renewal")
    assert (made.project, made.applicant, made.valid_until) == (
        project,
        admin,
        date(2028, 3, 31),
    )
    assert made.title == f"Renewal of {project.slug}"
    assert made.gpus == 0  # a renewal asks for no resources

    quota = {"apply": "project", "kind": "quota", "project": project.slug, "purpose": "Bigger"}
    answer = me.post(URL, {**quota, "gpus": "8", "vcpus": "", "valid_until": "2030-01-01"})
    assert answer.status_code == 302
    more = ProjectApplication.objects.get(kind="quota")
    assert (more.gpus, more.vcpus, more.valid_until) == (8, 0, None)

    operator = login(staff)
    operator.post(f"{URL}{made.pk}/review/", {"decision": "approve"})
    operator.post(f"{URL}{more.pk}/review/", {"decision": "approve"})
    project.refresh_from_db()
    assert project.valid_until == date(2028, 3, 31)
    assert project.quota.gpus == 8


def test_only_projects_you_administer_are_offered(login, project, other_project):
    member = add_member(project, role=Role.MEMBER)
    page = login(member).get(URL)
    assert 'id="project-application"' not in page.content.decode()  # they administer nothing
    answer = login(member).post(
        URL,
        {"apply": "project", "kind": "quota", "project": project.slug, "purpose": "p", "gpus": 1},
    )
    assert answer.status_code == 400
    assert errors_of(answer, "project")
    owner = login(project.owner)
    html = owner.get(URL).content.decode()
    assert f'<option value="{project.slug}"' in html
    assert f'<option value="{other_project.slug}"' not in html
    refused = owner.post(
        URL,
        {
            "apply": "project",
            "kind": "quota",
            "project": other_project.slug,
            "purpose": "p",
            "gpus": 1,
        },
    )
    assert refused.status_code == 400 and errors_of(refused, "project")
    assert not ProjectApplication.objects.exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"kind": "renewal"}, "valid_until"),  # a renewal needs its new end
        ({"kind": "renewal", "valid_until": "2027-01-01"}, "valid_until"),  # not later
        ({"kind": "renewal", "valid_until": "31/12/2028"}, "valid_until"),
        ({"kind": "quota"}, "vcpus"),  # a quota increase asks for something
        ({"kind": "quota", "gpus": "eight"}, "gpus"),
        ({"kind": "quota", "gpus": "-1"}, "gpus"),
        ({"kind": "quota", "gpus": "99999999999"}, "gpus"),
        ({"kind": "everything", "gpus": "1"}, "kind"),
        ({"kind": "quota", "gpus": "1", "purpose": ""}, "purpose"),
    ],
)
def test_bad_input_is_a_form_error_naming_the_field(login, project, change, field):
    tenants.project_update(project=project, valid_until=date(2027, 3, 31))
    body = {"apply": "project", "project": project.slug, "purpose": "p", **change}
    answer = login(project.owner).post(URL, body)
    assert answer.status_code == 400, answer.content.decode()
    assert errors_of(answer, field), (change, answer.content.decode())
    assert not ProjectApplication.objects.exists()


def test_a_new_project_form_refuses_a_number_too_large(login):
    form = {"slug": "big-lab", "title": "t", "purpose": "p", "gpus": "99999999999"}
    answer = login(UserFactory()).post(URL, form)
    assert answer.status_code == 400 and errors_of(answer, "gpus")


def test_the_dashboard_links_admins_to_the_forms(login, project):
    dashboard = reverse("portal:dashboard", kwargs={"slug": project.slug})
    html = login(project.owner).get(dashboard).content.decode()
    assert f"?project={project.slug}&amp;kind=renewal" in html
    assert f"?project={project.slug}&amp;kind=quota" in html
    reader = add_member(project, role=Role.READER)
    assert 'id="apply-links"' not in login(reader).get(dashboard).content.decode()


# --- amending -----------------------------------------------------------------------------------


@pytest.fixture
def returned(staff):
    applicant = UserFactory()
    made = applications.application_submit(
        applicant=applicant, slug="deep-sea", title="Deep sea", purpose="p", gpus=8
    )
    applications.application_review(
        application=made, reviewer=staff, decision="return", comment="fewer"
    )
    return made


@pytest.mark.parametrize("value", ["four", "-1", "4.5", "99999999999"])
def test_an_amend_with_a_bad_number_says_so(login, returned, value):
    me = login(returned.applicant)
    answer = me.post(f"{URL}{returned.pk}/amend/", {"gpus": value, "purpose": "less"})
    assert answer.status_code == 302
    [message] = said(answer)
    assert "not amended" in message and "gpus" in message
    returned.refresh_from_db()
    assert (returned.state, returned.gpus, returned.purpose) == ("returned", 8, "p")


def test_an_amend_changes_what_is_given(login, returned):
    answer = login(returned.applicant).post(
        f"{URL}{returned.pk}/amend/", {"gpus": "4", "vcpus": "", "purpose": ""}
    )
    assert answer.status_code == 302
    returned.refresh_from_db()
    assert (returned.state, returned.gpus, returned.purpose) == ("submitted", 4, "p")


def test_someone_elses_application_is_not_amended(login, returned):
    answer = login(UserFactory()).post(f"{URL}{returned.pk}/amend/", {"gpus": "1"})
    assert answer.status_code == 404


# --- reviewers ----------------------------------------------------------------------------------


@pytest.fixture
def institutions(staff):
    reviewer = person(X, "rev@x-univ.ac.jp")
    reviewers.reviewer_designate(user=reviewer, issuer=X, actor=staff)

    def apply(user, slug):
        return applications.application_submit(
            applicant=user, slug=slug, title=slug, purpose="p", gpus=1
        )

    return {
        "reviewer": reviewer,
        "x": apply(person(X, "xan@x-univ.ac.jp"), "from-x"),
        "y": apply(person(Y, "yui@y-univ.ac.jp"), "from-y"),
        "local": apply(UserFactory(), "from-local"),
        "own": apply(reviewer, "from-reviewer"),
        "staff": apply(staff, "from-staff"),
    }


def test_a_reviewer_sees_and_reviews_their_institutions_applications_only(login, institutions):
    i = institutions
    me = login(i["reviewer"])
    page = me.get(URL)
    assert listed(page) == {i["x"].pk, i["own"].pk}
    assert review_forms(page) == {i["x"].pk}
    html = page.content.decode()
    assert "from-y" not in html and "from-local" not in html
    assert "<th>Applicant</th>" in html
    for name in ("y", "local", "staff"):  # not theirs to see: 404 like a missing one
        assert me.post(f"{URL}{i[name].pk}/review/", {"decision": "approve"}).status_code == 404
        i[name].refresh_from_db()
        assert i[name].state == "submitted"
    own = me.post(f"{URL}{i['own'].pk}/review/", {"decision": "approve"}, follow=True)
    assert "your own application" in own.content.decode()
    i["own"].refresh_from_db()
    assert i["own"].state == "submitted"
    me.post(f"{URL}{i['x'].pk}/review/", {"decision": "approve"})
    i["x"].refresh_from_db()
    assert (i["x"].state, i["x"].reviewed_by) == ("approved", i["reviewer"])


def test_operators_see_every_application_and_review_all_but_their_own(login, staff, institutions):
    page = login(staff).get(URL)
    everyone = {a.pk for a in ProjectApplication.objects.all()}
    assert listed(page) == everyone
    assert review_forms(page) == everyone - {institutions["staff"].pk}


def test_applicants_see_only_their_own_and_no_review_buttons(login, institutions):
    applicant = institutions["y"].applicant
    page = login(applicant).get(URL)
    assert listed(page) == {institutions["y"].pk}
    assert review_forms(page) == set()
    assert "<th>Applicant</th>" not in page.content.decode()


def test_a_project_owned_by_someone_else_is_renewed_by_its_admins_only(login):
    project = make_project()
    outsider = UserFactory()
    answer = login(outsider).post(
        URL,
        {
            "apply": "project",
            "kind": "renewal",
            "project": project.slug,
            "purpose": "p",
            "valid_until": "2030-01-01",
        },
    )
    assert answer.status_code == 400 and errors_of(answer, "project")
