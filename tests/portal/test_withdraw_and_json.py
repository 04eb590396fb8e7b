"""Small portal actions the API had alone: the applicant withdraws an application
(``tenants.applications.application_withdraw``); an invoice downloads as its signed JSON
document, byte for byte the API's, and is verified (recomputed and compared)."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tenants import billing
from tenants.choices import Role
from tenants.models import ProjectApplication
from tests.factories import UserFactory, make_project

pytestmark = pytest.mark.django_db

APPLY = {"apply": "new", "title": "Protein folding", "purpose": "MD runs", "gpus": "4"}
APPLY |= {"memory_gib": "64", "storage_gib": "0", "global_ips": "0"}


def test_the_applicant_withdraws_an_application_no_one_else_does(login):
    applicant = UserFactory()
    me = login(applicant)
    answer = me.post(reverse("portal:applications"), {**APPLY, "vcpus": "32", "slug": "fold"})
    assert answer.status_code == 302, answer.content.decode()
    application = ProjectApplication.objects.get(applicant=applicant)
    withdraw = reverse("portal:application-withdraw", kwargs={"pk": application.pk})
    assert withdraw in me.get(reverse("portal:applications")).content.decode()

    assert login(UserFactory()).post(withdraw).status_code == 404  # not theirs to see
    application.refresh_from_db()
    assert application.state == "submitted"

    assert me.post(withdraw).status_code == 302
    application.refresh_from_db()
    assert application.state == "withdrawn"
    assert withdraw not in me.get(reverse("portal:applications")).content.decode()
    again = me.post(withdraw, follow=True)  # the service's refusal is a message, not a 500
    assert again.status_code == 200


def test_an_invoice_downloads_as_the_apis_json(login, project, cloud, rate_card):
    last_month = billing.month_start(billing.month_start(timezone.now().date()) - timedelta(1))
    [invoice] = billing.invoices_issue(period=last_month, projects=[project])
    url = reverse("portal:invoice-json", kwargs={"slug": project.slug, "pk": invoice.pk})
    reader = login(cloud["users"][Role.READER])
    billing_page = reverse("portal:billing", kwargs={"slug": project.slug})
    assert url in reader.get(billing_page).content.decode()
    response = reader.get(url)
    assert response["Content-Type"] == "application/json"
    assert response.content.decode() == invoice.document
    assert response["X-Content-SHA256"] == invoice.content_hash
    other = make_project()
    elsewhere = reverse("portal:invoice-json", kwargs={"slug": other.slug, "pk": invoice.pk})
    assert reader.get(elsewhere).status_code == 404


def test_an_invoice_is_verified_from_the_billing_page(login, project, cloud, rate_card):
    last_month = billing.month_start(billing.month_start(timezone.now().date()) - timedelta(1))
    [invoice] = billing.invoices_issue(period=last_month, projects=[project])
    url = reverse("portal:invoice-verify", kwargs={"slug": project.slug, "pk": invoice.pk})
    reader = login(cloud["users"][Role.READER])
    billing_page = reverse("portal:billing", kwargs={"slug": project.slug})
    assert url in reader.get(billing_page).content.decode()
    html = reader.get(url, follow=True).content.decode()
    assert f"verified: recomputed, identical ({invoice.content_hash})" in html
    other = make_project()
    elsewhere = reverse("portal:invoice-verify", kwargs={"slug": other.slug, "pk": invoice.pk})
    assert reader.get(elsewhere).status_code == 404
