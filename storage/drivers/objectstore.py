"""``ObjectStoreAdmin`` implementations: an S3 + IAM service (what moto's server offers;
the tests run against it on loopback) and Ceph RGW's admin operations API.

Both are called by the controller, never by a host agent: the object store is one
central service. Every backend exception becomes a ``StorageError``.
"""

from __future__ import annotations

import json
import secrets
import string
from urllib.parse import urlencode

import boto3
import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError

from storage.drivers.base import KeyPair, ObjectStoreAdmin, StorageError

POLICY_NAME = "kumo-buckets"
OWNER_TAG = "kumo-owner"
QUOTA_TAG = "kumo-quota-bytes"


def _code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


class _Boto:
    """Runs one boto3 call, turning its errors into StorageError (``ok`` codes are success)."""

    @staticmethod
    def call(what: str, fn, *args, ok: tuple[str, ...] = (), **kwargs):
        try:
            return fn(*args, **kwargs)
        except ClientError as e:
            if _code(e) in ok:
                return None
            raise StorageError(f"{what}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"{what}: {e}") from e


class S3IamAdmin(ObjectStoreAdmin):
    """An S3-compatible service with IAM: a project is an IAM user; a bucket is tagged with
    its owner and listed in the owner's inline policy ``kumo-buckets`` (s3:* on the bucket
    and its objects), the only grant the user has, so another project's key is refused by
    the service itself. The service keeps no byte quota: ``set_bucket_quota`` records the
    limit as a bucket tag, and Kumo's accounting compares usage against it."""

    enforces_quota = False

    def __init__(self, endpoint: str, access_key: str, secret_key: str, region: str = "us-east-1"):
        session = boto3.session.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=region
        )
        config = Config(retries={"max_attempts": 2}, s3={"addressing_style": "path"})
        self.s3 = session.client("s3", endpoint_url=endpoint, config=config)
        self.iam = session.client("iam", endpoint_url=endpoint, config=config)

    def ensure_user(self, user: str) -> None:
        _Boto.call(
            f"create user {user}", self.iam.create_user, UserName=user, ok=("EntityAlreadyExists",)
        )

    def delete_user(self, user: str) -> None:
        keys = _Boto.call(
            f"list keys of {user}", self.iam.list_access_keys, UserName=user, ok=("NoSuchEntity",)
        )
        if keys is None:
            return
        for key in keys["AccessKeyMetadata"]:
            self.delete_key(user, key["AccessKeyId"])
        _Boto.call(
            "delete policy",
            self.iam.delete_user_policy,
            UserName=user,
            PolicyName=POLICY_NAME,
            ok=("NoSuchEntity",),
        )
        _Boto.call(f"delete user {user}", self.iam.delete_user, UserName=user, ok=("NoSuchEntity",))

    def create_key(self, user: str) -> KeyPair:
        made = _Boto.call(f"create key of {user}", self.iam.create_access_key, UserName=user)
        key = made["AccessKey"]
        return KeyPair(key["AccessKeyId"], key["SecretAccessKey"])

    def delete_key(self, user: str, access_key_id: str) -> None:
        _Boto.call(
            f"delete key {access_key_id}",
            self.iam.delete_access_key,
            UserName=user,
            AccessKeyId=access_key_id,
            ok=("NoSuchEntity",),
        )

    def _owner(self, bucket: str) -> str | None:
        tags = _Boto.call(
            f"read tags of {bucket}",
            self.s3.get_bucket_tagging,
            Bucket=bucket,
            ok=("NoSuchTagSet", "NoSuchBucket"),
        )
        return {t["Key"]: t["Value"] for t in (tags or {}).get("TagSet", [])}.get(OWNER_TAG)

    def _grant(self, owner: str, bucket: str, *, allow: bool) -> None:
        found = _Boto.call(
            "read policy",
            self.iam.get_user_policy,
            UserName=owner,
            PolicyName=POLICY_NAME,
            ok=("NoSuchEntity",),
        )
        document = found["PolicyDocument"] if found else {"Statement": []}
        if isinstance(document, str):
            document = json.loads(document)
        statements = {s["Sid"]: s for s in document["Statement"]}
        sid = "kumo" + "".join(c for c in bucket if c.isalnum())
        if allow:
            statements[sid] = {
                "Sid": sid,
                "Effect": "Allow",
                "Action": "s3:*",
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            }
        else:
            statements.pop(sid, None)
        if not statements:
            _Boto.call(
                "delete policy",
                self.iam.delete_user_policy,
                UserName=owner,
                PolicyName=POLICY_NAME,
                ok=("NoSuchEntity",),
            )
            return
        document = {
            "Version": "2012-10-17",
            "Statement": [statements[k] for k in sorted(statements)],
        }
        _Boto.call(
            "write policy",
            self.iam.put_user_policy,
            UserName=owner,
            PolicyName=POLICY_NAME,
            PolicyDocument=json.dumps(document),
        )

    def ensure_bucket(self, bucket: str, owner: str) -> None:
        _Boto.call(
            f"create bucket {bucket}",
            self.s3.create_bucket,
            Bucket=bucket,
            ok=("BucketAlreadyOwnedByYou",),
        )
        current = self._owner(bucket)
        if current not in (None, owner):
            raise StorageError(f"bucket {bucket} belongs to {current}")
        if current is None:
            _Boto.call(
                f"tag bucket {bucket}",
                self.s3.put_bucket_tagging,
                Bucket=bucket,
                Tagging={"TagSet": [{"Key": OWNER_TAG, "Value": owner}]},
            )
        self._grant(owner, bucket, allow=True)

    def delete_bucket(self, bucket: str, owner: str) -> None:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        try:
            for page in pages:
                objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if objects:
                    self.s3.delete_objects(Bucket=bucket, Delete={"Objects": objects})
        except ClientError as e:
            if _code(e) != "NoSuchBucket":
                raise StorageError(f"empty bucket {bucket}: {e}") from e
        _Boto.call(
            f"delete bucket {bucket}", self.s3.delete_bucket, Bucket=bucket, ok=("NoSuchBucket",)
        )
        self._grant(owner, bucket, allow=False)

    def set_bucket_quota(self, bucket: str, owner: str, max_bytes: int) -> None:
        tags = {OWNER_TAG: owner, QUOTA_TAG: str(max_bytes)}
        _Boto.call(
            f"tag bucket {bucket}",
            self.s3.put_bucket_tagging,
            Bucket=bucket,
            Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]},
        )

    def bucket_usage(self, bucket: str) -> int:
        total = 0
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                total += sum(o["Size"] for o in page.get("Contents", []))
        except (ClientError, BotoCoreError) as e:
            raise StorageError(f"usage of {bucket}: {e}") from e
        return total


_KEY_ALPHABET = string.ascii_uppercase + string.digits


class RgwAdmin(ObjectStoreAdmin):
    """Ceph RGW through its admin operations API (``/admin/user``, ``/admin/bucket``), each
    request signed with AWS SigV4 by an RGW user holding the ``users`` and ``buckets`` admin
    caps. Keys are generated here and handed to RGW, so the secret is known without reading
    it back. Buckets are made over S3 by the admin user (``admin_uid``) and then linked to
    their owner, so
    only the owner's keys reach them; RGW enforces bucket quotas itself.

    Built against the documented API; tested by the requests it constructs (an
    ``httpx.MockTransport``), not against a running RGW.
    """

    enforces_quota = True

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        region: str = "default",
        *,
        admin_uid: str = "kumo-admin",
        transport: httpx.BaseTransport | None = None,
    ):
        self.endpoint = endpoint.rstrip("/")
        self.credentials = Credentials(access_key, secret_key)
        self.region = region
        self.admin_uid = admin_uid
        self.http = httpx.Client(transport=transport, timeout=30.0)

    def request(self, method: str, path: str, params: dict, body: bytes = b"") -> httpx.Response:
        """One signed request; 2xx and 404 are returned, anything else is a StorageError."""
        query = urlencode({k: ("" if v is True else v) for k, v in params.items()})
        url = f"{self.endpoint}{path}" + (f"?{query}" if query else "")
        signed = AWSRequest(method=method, url=url, data=body)
        S3SigV4Auth(self.credentials, "s3", self.region).add_auth(signed)
        try:
            response = self.http.request(method, url, content=body, headers=dict(signed.headers))
        except httpx.HTTPError as e:
            raise StorageError(f"{method} {path}: {e}") from e
        if response.status_code >= 300 and response.status_code != 404:
            raise StorageError(f"{method} {path}: {response.status_code} {response.text[:200]}")
        return response

    def ensure_user(self, user: str) -> None:
        if self.request("GET", "/admin/user", {"uid": user, "format": "json"}).status_code == 404:
            self.request(
                "PUT", "/admin/user", {"uid": user, "display-name": user, "format": "json"}
            )

    def delete_user(self, user: str) -> None:
        self.request("DELETE", "/admin/user", {"uid": user, "purge-data": "false"})

    def create_key(self, user: str) -> KeyPair:
        key = KeyPair(
            "".join(secrets.choice(_KEY_ALPHABET) for _ in range(20)), secrets.token_urlsafe(30)
        )
        response = self.request(
            "PUT",
            "/admin/user",
            {
                "key": True,
                "uid": user,
                "key-type": "s3",
                "access-key": key.access_key_id,
                "secret-key": key.secret_access_key,
                "format": "json",
            },
        )
        if response.status_code == 404:
            raise StorageError(f"no user {user}")
        return key

    def delete_key(self, user: str, access_key_id: str) -> None:
        self.request(
            "DELETE", "/admin/user", {"key": True, "uid": user, "access-key": access_key_id}
        )

    def ensure_bucket(self, bucket: str, owner: str) -> None:
        found = self.request("GET", "/admin/bucket", {"bucket": bucket, "format": "json"})
        if found.status_code == 404:
            self.request("PUT", f"/{bucket}", {})
            current = self.admin_uid
        else:
            current = found.json().get("owner")
        if current == owner:
            return
        if current != self.admin_uid:
            raise StorageError(f"bucket {bucket} belongs to {current}")
        self.request("PUT", "/admin/bucket", {"bucket": bucket, "uid": owner, "format": "json"})

    def delete_bucket(self, bucket: str, owner: str) -> None:
        self.request("DELETE", "/admin/bucket", {"bucket": bucket, "purge-objects": "true"})

    def set_bucket_quota(self, bucket: str, owner: str, max_bytes: int) -> None:
        body = json.dumps({"enabled": True, "max_size": max_bytes, "max_objects": -1}).encode()
        self.request(
            "PUT", "/admin/bucket", {"quota": True, "uid": owner, "bucket": bucket}, body=body
        )

    def bucket_usage(self, bucket: str) -> int:
        response = self.request(
            "GET", "/admin/bucket", {"bucket": bucket, "stats": "true", "format": "json"}
        )
        if response.status_code == 404:
            raise StorageError(f"no bucket {bucket}")
        usage = response.json().get("usage", {}).get("rgw.main", {})
        return int(usage.get("size_actual", usage.get("size", 0)))
