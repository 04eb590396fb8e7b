"""A share made, extended and deleted from the storage page: ``storage.services.share_create``,
``share_extend`` and ``share_delete`` (audited, its host told), a member's to do, a reader's
refused; another project's share a 404; a tier the site does not serve is no choice."""

import re

import pytest
from django.urls import reverse

from controlplane.models import AuditEvent
from storage import services
from storage.models import Share
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_project
from tests.portal.test_storage_actions import backends  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.django_db


def delete_url(project, share):
    return reverse("portal:share-delete", kwargs={"slug": project.slug, "pk": share.pk})


def test_a_member_deletes_a_share_from_the_storage_page(login, project, cloud):
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=10)
    storage_page = reverse("portal:storage", kwargs={"slug": project.slug})
    html = login(cloud["users"][Role.MEMBER]).get(storage_page).content.decode()
    assert delete_url(project, share) in html

    reader = login(cloud["users"][Role.READER])
    assert reader.post(delete_url(project, share)).status_code == 403
    assert Share.objects.filter(pk=share.pk).exists()

    response = login(cloud["users"][Role.MEMBER]).post(delete_url(project, share), follow=True)
    assert response.status_code == 200
    assert "Share data deleted." in response.content.decode()
    assert not Share.objects.filter(pk=share.pk).exists()
    assert AuditEvent.objects.filter(action="share.delete").exists()


def test_another_projects_share_is_not_found(login, project, cloud):
    other = make_project(slug="other-lab")
    share = services.share_create(project=other, name="theirs", tier="fast", quota_gib=10)
    response = login(cloud["users"][Role.ADMIN]).post(delete_url(project, share))
    assert response.status_code == 404
    assert Share.objects.filter(pk=share.pk).exists()


def extend_url(project, share):
    return reverse("portal:share-extend", kwargs={"slug": project.slug, "pk": share.pk})


def test_a_member_extends_a_share_and_a_smaller_quota_is_a_400(login, project, cloud):
    Quota.objects.filter(project=project).update(storage_gib=1000)
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=10)
    member = login(cloud["users"][Role.MEMBER])
    storage_page = reverse("portal:storage", kwargs={"slug": project.slug})
    assert extend_url(project, share) in member.get(storage_page).content.decode()

    refused = member.post(extend_url(project, share), {"quota_gib": "5"})
    assert refused.status_code == 400
    assert "must be larger" in refused.content.decode()
    assert member.post(extend_url(project, share), {"quota_gib": "x"}).status_code == 400

    response = member.post(extend_url(project, share), {"quota_gib": "40"}, follow=True)
    assert "Share data extended to 40 GiB." in response.content.decode()
    share.refresh_from_db()
    assert share.quota_gib == 40
    assert AuditEvent.objects.filter(action="share.extend").exists()
    reader = login(cloud["users"][Role.READER])
    assert reader.post(extend_url(project, share), {"quota_gib": "50"}).status_code == 403


def storage_url(project):
    return reverse("portal:storage", kwargs={"slug": project.slug})


def make_share(client, project, **fields):
    data = {"form": "share", "name": "data", "tier": "fast", "quota_gib": "10", **fields}
    return client.post(storage_url(project), data)


def test_a_member_makes_a_share_from_the_storage_page_audited(login, project, cloud):
    Quota.objects.filter(project=project).update(storage_gib=100)
    member = cloud["users"][Role.MEMBER]
    client = login(member)
    page = client.get(storage_url(project)).content.decode()
    assert 'id="share-create"' in page and 'value="fast"' in page
    assert 'class="errorlist"' not in page  # a GET shows its forms unbound, without errors
    assert 'value="large"' not in page  # a tier this site does not serve is no choice
    response = make_share(client, project)
    assert response.status_code == 302
    share = Share.objects.for_project(project).get(name="data")
    assert (share.tier, share.quota_gib, share.mount_point) == ("fast", 10, "/fast/data")
    event = AuditEvent.objects.for_project(project).get(action="share.create")
    assert (event.actor, event.source) == (member, "portal")
    assert "Share created" in client.get(storage_url(project)).content.decode()


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"name": "Not_A_Name"}, "name", ""),
        ({"tier": "large"}, "tier", "valid choice"),
        ({"quota_gib": "0"}, "quota_gib", "greater than or equal to 1"),
        ({"quota_gib": "500"}, "__all__", "storage_gib"),
    ],
)
def test_a_share_the_portal_refuses_names_the_field(login, project, cloud, fields, field, says):
    Quota.objects.filter(project=project).update(storage_gib=100)
    response = make_share(login(cloud["users"][Role.MEMBER]), project, **fields)
    assert 400 <= response.status_code < 500
    html = response.content.decode()
    if field == "__all__":  # the form's own error, above its fields
        assert re.search(rf'<ul class="errorlist" role="alert"><li>[^<]*{says}', html)
    else:
        assert f'data-field="{field}"' in html and says in html
    assert not Share.objects.for_project(project).exists()


def test_a_reader_cannot_make_a_share_and_a_site_without_tiers_says_so(
    login, project, cloud, settings
):
    assert make_share(login(cloud["users"][Role.READER]), project).status_code == 403
    settings.SHARE_TIERS = {}
    page = login(cloud["users"][Role.MEMBER]).get(storage_url(project)).content.decode()
    assert 'id="no-share-tiers"' in page and 'id="share-create"' not in page
    assert not Share.objects.exists()
