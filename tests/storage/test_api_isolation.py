"""Isolation contracts of the storage project endpoints. Buckets and keys live on the
in-memory object store here (``tests/storage/test_api.py`` uses a real one)."""

import itertools

import pytest

from storage import services
from storage.drivers.fake import FakeObjectStore
from storage.models import AccessKey, Bucket, Share, Volume
from tenants.choices import Role
from tenants.models import Quota
from tests.factories import make_host, make_vm
from tests.isolation import ProjectEndpointContract

UUID_MISSING = "00000000-0000-4000-8000-000000000000"
_n = itertools.count(1)


@pytest.fixture(autouse=True)
def storage_backends(monkeypatch, settings, db):
    store = FakeObjectStore()
    monkeypatch.setattr(services, "object_store", lambda: store)
    settings.SHARE_TIERS = {"fast": {"backend": "lustre", "host": "mds-01", "source": "m:/fast"}}
    make_host("mds-01", kind="cpu")


def _roomy(project):
    Quota.objects.filter(project=project).update(storage_gib=100_000, buckets=100)
    return project


class TestVolumeIsolation(ProjectEndpointContract):
    object_actions = (("post", "attach/"), ("post", "detach/"), ("post", "extend/"))
    basename = "project-volume"
    actions = ("list", "retrieve", "create", "delete")
    missing_lookup = UUID_MISSING
    create_references_nothing = True

    def make_object(self, project):
        return services.volume_create(project=_roomy(project), name=f"v{next(_n)}", size_gib=1)

    def create_payload(self, project):
        _roomy(project)
        return {"name": f"new{next(_n)}", "size_gib": 1}

    def count(self, project):
        return Volume.objects.for_project(project).count()

    def foreign_action_payloads(self, obj, other):
        theirs = make_vm(_roomy(other))
        return [("post", "attach/", {"vm": str(theirs.pk)})]


class TestShareIsolation(ProjectEndpointContract):
    object_actions = (("post", "extend/"),)
    basename = "project-share"
    actions = ("list", "retrieve", "create", "delete")
    missing_lookup = UUID_MISSING
    create_references_nothing = True

    def make_object(self, project):
        return services.share_create(
            project=_roomy(project), name=f"s{next(_n)}", tier="fast", quota_gib=1
        )

    def create_payload(self, project):
        _roomy(project)
        return {"name": f"new{next(_n)}", "tier": "fast", "quota_gib": 1}

    def count(self, project):
        return Share.objects.for_project(project).count()


class TestBucketIsolation(ProjectEndpointContract):
    basename = "project-bucket"
    actions = ("list", "retrieve", "create", "update", "delete")
    id_field = "name"
    missing_lookup = "no-such-bucket"
    create_references_nothing = True

    def make_object(self, project):
        return services.bucket_create(project=_roomy(project), name=f"b-{next(_n)}", quota_gib=1)

    def lookup(self, obj):
        return obj.name

    def create_payload(self, project):
        _roomy(project)
        return {"name": f"new-{next(_n)}", "quota_gib": 1}

    def update_payload(self, obj):
        return {"quota_gib": 2}

    def count(self, project):
        return Bucket.objects.for_project(project).count()


class TestAccessKeyIsolation(ProjectEndpointContract):
    basename = "project-accesskey"
    actions = ("list", "retrieve", "create", "delete")
    write_role = Role.ADMIN
    create_references_nothing = True

    def make_object(self, project):
        return services.access_key_create(project=project)[0]

    def create_payload(self, project):
        return {"description": "ci"}

    def count(self, project):
        return AccessKey.objects.for_project(project).count()
