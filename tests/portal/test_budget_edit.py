"""A budget changed from its page (``tenants.billing.budget_update``, what the API's budget
PATCH does): admins only, bad thresholds a 400 naming the field, another project's a 404."""

from decimal import Decimal

import pytest
from django.urls import reverse

from tenants import billing
from tenants.choices import Role
from tests.factories import make_project

pytestmark = pytest.mark.django_db


def test_an_admin_changes_a_budget(login, project, cloud, rate_card):
    budget = billing.budget_create(
        project=project, name="monthly", amount="1000", thresholds=[50, 100], policy="notify"
    )
    url = reverse("portal:budget-edit", kwargs={"slug": project.slug, "pk": budget.pk})
    admin = login(cloud["users"][Role.ADMIN])
    billing_page = reverse("portal:billing", kwargs={"slug": project.slug})
    assert url in admin.get(billing_page).content.decode()
    form = admin.get(url).content.decode()
    assert 'value="monthly"' in form and 'value="50, 100"' in form

    data = {"name": "monthly", "amount": "2500", "thresholds": "80, 100", "policy": "notify"}
    assert login(cloud["users"][Role.MEMBER]).post(url, data).status_code == 403
    bad = admin.post(url, data | {"thresholds": "80, 80"})
    assert bad.status_code == 400
    assert 'data-field="thresholds"' in bad.content.decode()

    response = admin.post(url, data, follow=True)
    assert "Budget monthly changed." in response.content.decode()
    budget.refresh_from_db()
    assert (budget.amount, budget.thresholds) == (Decimal("2500"), [80, 100])

    other = make_project()
    elsewhere = reverse("portal:budget-edit", kwargs={"slug": other.slug, "pk": budget.pk})
    assert admin.get(elsewhere).status_code == 404
