"""The storage API, and the object storage acceptance test: a bucket made through Kumo
works with a plain boto3 client and the key Kumo issued, and refuses another project's
key (a real S3 + IAM service on loopback)."""

import pytest
from botocore.exceptions import ClientError

from controlplane.models import AuditEvent
from storage.models import AccessKey
from tests.factories import make_host, make_vm
from tests.storage.conftest import s3_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def object_store(settings, s3_server):
    settings.OBJECT_STORE = {
        "kind": "s3iam",
        "endpoint": s3_server["endpoint"],
        "access_key": s3_server["access_key"],
        "secret_key": s3_server["secret_key"],
        "region": "us-east-1",
    }
    return s3_server


def _url(project, path):
    return f"/api/v1/projects/{project.slug}/{path}"


def test_a_bucket_made_through_kumo_serves_its_projects_key_only(
    client_for, project, other_project, object_store
):
    api = client_for(project.owner)
    made = api.post(
        _url(project, "buckets/"), {"name": "genome-reads", "quota_gib": 5}, format="json"
    )
    assert made.status_code == 201, made.content
    assert made.json()["endpoint"] == object_store["endpoint"]
    key = api.post(_url(project, "access-keys/"), {"description": "pipeline"}, format="json")
    assert key.status_code == 201, key.content
    body = key.json()
    s3 = s3_client(object_store["endpoint"], body["access_key_id"], body["secret_access_key"])
    s3.put_object(Bucket="genome-reads", Key="run1/reads.fastq", Body=b"ACGT" * 1000)
    listed = s3.list_objects_v2(Bucket="genome-reads")["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("run1/reads.fastq", 4000)]

    # the secret was shown once: nowhere in the API or the audit trail afterwards
    shown = api.get(_url(project, f"access-keys/{body['id']}/")).json()
    assert "secret_access_key" not in shown
    events = AuditEvent.objects.filter(project=project)
    assert all(body["secret_access_key"] not in str(e.detail) for e in events)

    theirs = client_for(other_project.owner).post(
        _url(other_project, "access-keys/"), {}, format="json"
    )
    other = theirs.json()
    intruder = s3_client(
        object_store["endpoint"], other["access_key_id"], other["secret_access_key"]
    )
    with pytest.raises(ClientError) as refused:
        intruder.get_object(Bucket="genome-reads", Key="run1/reads.fastq")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"

    # usage is read for billing; deleting the key revokes it at the service
    from storage import services

    assert services.buckets_measure() == 1
    assert api.get(_url(project, "buckets/genome-reads/")).json()["used_bytes"] == 4000
    assert api.delete(_url(project, f"access-keys/{body['id']}/")).status_code == 204
    with pytest.raises(ClientError) as revoked:
        s3.list_objects_v2(Bucket="genome-reads")
    assert revoked.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    assert api.delete(_url(project, "buckets/genome-reads/")).status_code == 204


def test_a_taken_bucket_name_is_409_and_bad_names_are_400(client_for, project, object_store):
    api = client_for(project.owner)
    assert (
        api.post(
            _url(project, "buckets/"), {"name": "shared-name", "quota_gib": 1}, format="json"
        ).status_code
        == 201
    )
    again = api.post(
        _url(project, "buckets/"), {"name": "shared-name", "quota_gib": 1}, format="json"
    )
    assert again.status_code == 409
    bad = api.post(_url(project, "buckets/"), {"name": "Bad_Name", "quota_gib": 1}, format="json")
    assert bad.status_code == 400 and "name" in bad.json()["details"]


def test_without_an_object_store_buckets_answer_409(client_for, project, settings):
    settings.OBJECT_STORE = {**settings.OBJECT_STORE, "kind": ""}
    response = client_for(project.owner).post(
        _url(project, "buckets/"), {"name": "genome-reads", "quota_gib": 1}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "object_storage_unavailable"
    assert not AccessKey.objects.exists()


def test_volume_lifecycle_through_the_api(client_for, project, other_project):
    make_host("gpu-01")
    vm = make_vm(project)
    foreign_vm = make_vm(other_project)
    api = client_for(project.owner)
    made = api.post(_url(project, "volumes/"), {"name": "scratch", "size_gib": 10}, format="json")
    assert made.status_code == 201, made.content
    volume = made.json()
    assert volume["state"] == "available" and volume["tier"] == "shared"
    base = _url(project, f"volumes/{volume['id']}/")
    refused = api.post(base + "attach/", {"vm": str(foreign_vm.pk)}, format="json")
    assert refused.status_code == 400 and "vm" in refused.json()["details"]
    attached = api.post(base + "attach/", {"vm": str(vm.pk)}, format="json")
    assert attached.status_code == 200, attached.content
    assert attached.json()["device"] == "vdb"
    assert attached.json()["guest_path"].startswith("/dev/disk/by-id/virtio-")
    assert api.delete(base).status_code == 409
    grown = api.post(base + "extend/", {"size_gib": 5}, format="json")
    assert grown.status_code == 400 and "size_gib" in grown.json()["details"]
    assert api.post(base + "extend/", {"size_gib": 20}, format="json").json()["size_gib"] == 20
    assert api.post(base + "detach/").json()["state"] == "available"
    assert api.delete(base).status_code == 204


def test_share_mount_instructions_through_the_api(client_for, project, settings):
    settings.SHARE_TIERS = {
        "fast": {"backend": "lustre", "host": "mds-01", "source": "10.0.0.1@o2ib:/fast"}
    }
    make_host("mds-01", kind="cpu")
    api = client_for(project.owner)
    made = api.post(
        _url(project, "shares/"), {"name": "data", "tier": "fast", "quota_gib": 100}, format="json"
    )
    assert made.status_code == 201, made.content
    share = made.json()
    assert share["ready"] is False
    assert share["mount_command"] == (
        f"mkdir -p /fast/data && mount -t lustre {share['mount_source']} /fast/data"
    )
    unoffered = api.post(
        _url(project, "shares/"), {"name": "bulk", "tier": "large", "quota_gib": 1}, format="json"
    )
    assert unoffered.status_code == 409 and unoffered.json()["code"] == "share_unavailable"
