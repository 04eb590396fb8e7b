"""A bucket's quota changed from the storage page (``storage.services.bucket_update``, what
the API's bucket PATCH does): audited, a rise counted against the project's quota (409 on
the form), a reader refused."""

import pytest
from django.urls import reverse

from controlplane.models import AuditEvent
from storage import services
from storage.models import Bucket
from tenants.choices import Role
from tenants.models import Quota
from tests.portal.test_storage_actions import backends  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.django_db


def test_a_member_sets_a_buckets_quota(login, project, cloud):
    Quota.objects.filter(project=project).update(storage_gib=100, buckets=4)
    bucket = services.bucket_create(project=project, name="genome-reads", quota_gib=10)
    url = reverse("portal:bucket-quota", kwargs={"slug": project.slug, "pk": bucket.pk})
    member = login(cloud["users"][Role.MEMBER])
    storage_page = reverse("portal:storage", kwargs={"slug": project.slug})
    assert url in member.get(storage_page).content.decode()

    response = member.post(url, {"quota_gib": "50"}, follow=True)
    assert "Bucket genome-reads&#x27;s quota is 50 GiB." in response.content.decode()
    assert Bucket.objects.get(pk=bucket.pk).quota_gib == 50
    assert AuditEvent.objects.filter(action="bucket.update").exists()

    assert member.post(url, {"quota_gib": "5000"}).status_code == 409  # beyond the quota
    assert member.post(url, {"quota_gib": "0"}).status_code == 400
    reader = login(cloud["users"][Role.READER])
    assert reader.post(url, {"quota_gib": "20"}).status_code == 403
    assert Bucket.objects.get(pk=bucket.pk).quota_gib == 50
