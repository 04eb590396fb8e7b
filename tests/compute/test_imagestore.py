"""The image store contract, run against both stores: a directory, and a bucket on a real
S3 service on loopback (moto's server, ``s3_server``)."""

import hashlib
import io
import urllib.request
import uuid
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from compute.drivers import imagestore

DATA = b"kumo image " * 1_100_000  # 12 MB: two multipart parts of 8 MiB on S3
SHA = "sha256:" + hashlib.sha256(DATA).hexdigest()


class Broken(io.RawIOBase):
    """A body that breaks off after ``after`` bytes, as a client that went away."""

    def __init__(self, data: bytes, after: int):
        self.data, self.after, self.pos = data, after, 0

    def read(self, n=-1):
        if self.pos >= self.after:
            raise OSError("connection reset by peer")
        chunk = self.data[self.pos : min(self.pos + n, self.after)]
        self.pos += len(chunk)
        return chunk


@pytest.fixture(params=["dir", "s3"])
def store(request, tmp_path):
    if request.param == "dir":
        yield imagestore.DirectoryStore(tmp_path / "store")
        return
    s3 = request.getfixturevalue("s3_server")
    store = imagestore.S3Store(
        endpoint=s3["endpoint"],
        access_key=s3["access_key"],
        secret_key=s3["secret_key"],
        bucket=f"img-{uuid.uuid4().hex[:8]}",
    )
    yield store


def _leftovers(store) -> list[str]:
    """Everything the store holds, whole or partial."""
    if isinstance(store, imagestore.DirectoryStore):
        return sorted(str(p) for p in store.root.rglob("*") if p.is_file())
    objects = store.s3.list_objects_v2(Bucket=store.bucket).get("Contents", [])
    uploads = store.s3.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    return [o["Key"] for o in objects] + [f"upload {u['Key']}" for u in uploads]


def test_put_streams_and_computes_the_checksum_and_size(store):
    stored = store.put("images/1/a", io.BytesIO(DATA), length=len(DATA))
    assert stored == imagestore.Stored(key="images/1/a", size=len(DATA), checksum=SHA)
    assert store.exists("images/1/a")
    assert b"".join(store.open("images/1/a")) == DATA


def test_put_to_eof_without_a_length(store):
    assert store.put("k", io.BytesIO(DATA)).size == len(DATA)


def test_a_checksum_mismatch_leaves_nothing(store):
    with pytest.raises(imagestore.ChecksumMismatch) as e:
        store.put("images/1/a", io.BytesIO(DATA), expected_checksum="sha256:" + "1" * 64)
    assert e.value.actual == SHA
    assert not store.exists("images/1/a")
    assert _leftovers(store) == []


def test_an_upload_that_breaks_off_leaves_nothing(store):
    with pytest.raises(OSError):
        store.put("images/1/a", Broken(DATA, 9_500_000), length=len(DATA))
    assert _leftovers(store) == []


def test_a_short_body_is_incomplete_and_leaves_nothing(store):
    with pytest.raises(imagestore.Incomplete):
        store.put("images/1/a", io.BytesIO(DATA[:1000]), length=len(DATA))
    assert _leftovers(store) == []


def test_a_body_over_the_limit_leaves_nothing(store):
    with pytest.raises(imagestore.TooLarge):
        store.put("images/1/a", io.BytesIO(DATA), max_bytes=len(DATA) - 1)
    assert _leftovers(store) == []


def test_delete_is_idempotent(store):
    store.put("images/2/b", io.BytesIO(b"x"))
    store.delete("images/2/b")
    store.delete("images/2/b")
    assert not store.exists("images/2/b")


def test_the_fetch_url_serves_the_bytes(store, request):
    store.put("images/3/c", io.BytesIO(DATA))
    url = store.fetch_url("images/3/c", expires_s=60)
    if isinstance(store, imagestore.S3Store):
        # A presigned GET: signed, expiring, naming the object. moto's server checks only
        # Authorization headers, never query-string signatures, so the GET below runs in
        # one request of its unauthenticated window.
        query = parse_qs(urlsplit(url).query)
        assert query["X-Amz-Expires"] == ["60"] and query["X-Amz-Signature"]
        assert urlsplit(url).path == f"/{store.bucket}/images/3/c"
        endpoint = request.getfixturevalue("s3_server")["endpoint"]
        httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"1")
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == DATA


def test_keys_cannot_escape_the_store(store):
    for key in ("../x", "/etc/passwd", "a//b", ""):
        with pytest.raises(imagestore.ImageStoreError):
            store.put(key, io.BytesIO(b"x"))


def test_a_directory_store_hosts_cannot_read_offers_no_url(tmp_path):
    store = imagestore.DirectoryStore(tmp_path, file_urls=False)
    store.put("k", io.BytesIO(b"x"))
    assert store.fetch_url("k", expires_s=60) == ""
