"""The ``ObjectStoreAdmin`` contract, run against the in-memory fake and against a real
S3 + IAM service on loopback (moto's server, which checks every request's signature and
the caller's IAM policies); and the Ceph RGW driver's requests, checked as built (no RGW
here: an ``httpx.MockTransport`` answers as RGW's admin API documents)."""

import json
import uuid
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from botocore.exceptions import ClientError

from storage.drivers.base import StorageError
from storage.drivers.fake import FakeObjectStore
from storage.drivers.objectstore import RgwAdmin, S3IamAdmin
from tests.storage.conftest import s3_client


@pytest.fixture(params=["fake", "s3iam"])
def store(request):
    if request.param == "fake":
        return FakeObjectStore()
    server = request.getfixturevalue("s3_server")
    return S3IamAdmin(server["endpoint"], server["access_key"], server["secret_key"])


def _name(prefix="b"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_users_and_keys_are_idempotent(store):
    user = _name("u")
    store.ensure_user(user)
    store.ensure_user(user)
    key = store.create_key(user)
    assert key.access_key_id and key.secret_access_key
    assert store.create_key(user).access_key_id != key.access_key_id
    store.delete_key(user, key.access_key_id)
    store.delete_key(user, key.access_key_id)
    store.delete_user(user)
    store.delete_user(user)


def test_a_key_of_a_missing_user_is_an_error(store):
    with pytest.raises(StorageError):
        store.create_key(_name("nobody"))


def test_a_bucket_is_made_once_and_belongs_to_its_owner(store):
    owner, other, bucket = _name("u"), _name("u"), _name()
    store.ensure_user(owner)
    store.ensure_user(other)
    store.ensure_bucket(bucket, owner)
    store.ensure_bucket(bucket, owner)
    with pytest.raises(StorageError, match="belongs to"):
        store.ensure_bucket(bucket, other)
    store.set_bucket_quota(bucket, owner, 10 * 2**30)
    assert store.bucket_usage(bucket) == 0
    store.delete_bucket(bucket, owner)
    store.delete_bucket(bucket, owner)
    with pytest.raises(StorageError):
        store.bucket_usage(bucket)


def test_only_the_owners_keys_reach_a_bucket(s3_server):
    store = S3IamAdmin(s3_server["endpoint"], s3_server["access_key"], s3_server["secret_key"])
    owner, other, bucket = _name("u"), _name("u"), _name()
    for user in (owner, other):
        store.ensure_user(user)
    mine, theirs = store.create_key(owner), store.create_key(other)
    store.ensure_bucket(bucket, owner)
    s3 = s3_client(s3_server["endpoint"], mine.access_key_id, mine.secret_access_key)
    s3.put_object(Bucket=bucket, Key="reads/sample.fastq", Body=b"ACGT" * 256)
    assert s3.get_object(Bucket=bucket, Key="reads/sample.fastq")["Body"].read() == b"ACGT" * 256
    assert store.bucket_usage(bucket) == 1024
    intruder = s3_client(s3_server["endpoint"], theirs.access_key_id, theirs.secret_access_key)
    for call in (
        lambda: intruder.get_object(Bucket=bucket, Key="reads/sample.fastq"),
        lambda: intruder.list_objects_v2(Bucket=bucket),
        lambda: intruder.put_object(Bucket=bucket, Key="x", Body=b"x"),
    ):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] == "AccessDenied"
    store.delete_key(owner, mine.access_key_id)
    with pytest.raises(ClientError) as revoked:
        s3.get_object(Bucket=bucket, Key="reads/sample.fastq")
    assert revoked.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    store.delete_bucket(bucket, owner)  # with its object


# --- Ceph RGW: the requests as built -------------------------------------------------------------


class FakeRgw:
    """Answers RGW admin API requests from a little state, recording each request."""

    def __init__(self):
        self.requests: list[httpx.Request] = []
        self.users: set[str] = set()
        self.buckets: dict[str, str] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path, query = request.url.path, parse_qs(urlsplit(str(request.url)).query, True)
        q = {k: v[0] for k, v in query.items()}
        if path == "/admin/user" and request.method == "GET":
            found = q["uid"] in self.users
            return httpx.Response(200 if found else 404, json={"user_id": q["uid"]})
        if path == "/admin/user" and request.method == "PUT":
            if "key" in q and q["uid"] not in self.users:
                return httpx.Response(404, json={"Code": "NoSuchUser"})
            self.users.add(q["uid"])
            return httpx.Response(200, json={"keys": []})
        if path == "/admin/bucket" and request.method == "GET":
            if q["bucket"] not in self.buckets:
                return httpx.Response(404, json={"Code": "NoSuchBucket"})
            usage = {"rgw.main": {"size": 2048, "size_actual": 4096}}
            return httpx.Response(200, json={"owner": self.buckets[q["bucket"]], "usage": usage})
        if path == "/admin/bucket" and request.method == "PUT":
            if "quota" not in q:
                self.buckets[q["bucket"]] = q["uid"]
            return httpx.Response(200)
        if request.method == "PUT":  # S3 CreateBucket by the admin user
            self.buckets[path.strip("/")] = "kumo-admin"
            return httpx.Response(200)
        return httpx.Response(200)


@pytest.fixture
def rgw():
    fake = FakeRgw()
    admin = RgwAdmin(
        "https://rgw.example:8443", "ADMINKEY", "adminsecret", transport=httpx.MockTransport(fake)
    )
    return admin, fake


def _sent(request: httpx.Request) -> tuple[str, str, dict]:
    query = parse_qs(urlsplit(str(request.url)).query, keep_blank_values=True)
    return request.method, request.url.path, {k: v[0] for k, v in query.items()}


def test_rgw_requests_are_sigv4_signed_by_the_admin(rgw):
    admin, fake = rgw
    admin.ensure_user("kumo-genome")
    for request in fake.requests:
        auth = request.headers["authorization"]
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=ADMINKEY/")
        assert "/default/s3/aws4_request" in auth
        assert "x-amz-date" in request.headers and "x-amz-content-sha256" in request.headers


def test_rgw_user_key_bucket_and_quota_requests(rgw):
    admin, fake = rgw
    admin.ensure_user("kumo-genome")
    admin.ensure_user("kumo-genome")
    key = admin.create_key("kumo-genome")
    admin.ensure_bucket("genome-reads", "kumo-genome")
    admin.set_bucket_quota("genome-reads", "kumo-genome", 5 * 2**30)
    assert admin.bucket_usage("genome-reads") == 4096
    sent = [_sent(r) for r in fake.requests]
    assert sent[:3] == [
        ("GET", "/admin/user", {"uid": "kumo-genome", "format": "json"}),
        (
            "PUT",
            "/admin/user",
            {"uid": "kumo-genome", "display-name": "kumo-genome", "format": "json"},
        ),
        ("GET", "/admin/user", {"uid": "kumo-genome", "format": "json"}),
    ]
    method, path, q = sent[3]
    assert (method, path, q["uid"], q["key-type"]) == ("PUT", "/admin/user", "kumo-genome", "s3")
    assert (q["access-key"], q["secret-key"]) == (key.access_key_id, key.secret_access_key)
    assert "key" in q
    assert sent[4:7] == [
        ("GET", "/admin/bucket", {"bucket": "genome-reads", "format": "json"}),
        ("PUT", "/genome-reads", {}),
        (
            "PUT",
            "/admin/bucket",
            {"bucket": "genome-reads", "uid": "kumo-genome", "format": "json"},
        ),
    ]
    quota = fake.requests[7]
    assert _sent(quota) == (
        "PUT",
        "/admin/bucket",
        {"quota": "", "uid": "kumo-genome", "bucket": "genome-reads"},
    )
    assert json.loads(quota.content) == {"enabled": True, "max_size": 5 * 2**30, "max_objects": -1}


def test_rgw_refuses_another_owners_bucket_and_reports_errors(rgw):
    admin, fake = rgw
    fake.buckets["taken"] = "kumo-someone"
    with pytest.raises(StorageError, match="belongs to kumo-someone"):
        admin.ensure_bucket("taken", "kumo-genome")
    with pytest.raises(StorageError, match="no user"):
        admin.create_key("kumo-nobody")
    with pytest.raises(StorageError, match="no bucket"):
        admin.bucket_usage("missing")
    broken = RgwAdmin(
        "https://rgw.example",
        "A",
        "B",
        transport=httpx.MockTransport(lambda r: httpx.Response(403)),
    )
    with pytest.raises(StorageError, match="403"):
        broken.delete_user("kumo-genome")
