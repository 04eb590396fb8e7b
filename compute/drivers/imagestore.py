"""Where images' bytes live: a directory (the embedded default, under ``var/``) or a bucket
on the S3-compatible object store (production). No Django here.

The store is written by the web process only (an upload streams through it) and read by
hosts' agents, which fetch an image by the URL ``fetch_url`` gives (a presigned GET on the
object store; a ``file://`` path for a directory every host can read, or, when hosts
cannot, a signed URL the web process serves from ``open``).

Guarantees every store keeps:

- ``put`` streams: it holds one chunk at a time, computes the SHA-256 and size as the
  bytes pass, and makes the object visible under its key only when every byte arrived and
  the checksum (if one was expected) and size limit hold. On any failure nothing is left
  under the key, nor anywhere else.
- ``delete`` of a missing key is success.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

CHUNK = 1 << 20  # bytes read, hashed and written at a time
S3_PART = 8 << 20  # multipart upload part size (S3's minimum is 5 MiB but for the last)


class ImageStoreError(Exception):
    """The store refused or failed; nothing was left behind."""


class ChecksumMismatch(ImageStoreError):
    def __init__(self, expected: str, actual: str):
        super().__init__(f"checksum mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class TooLarge(ImageStoreError):
    def __init__(self, limit: int):
        super().__init__(f"the image is larger than the limit of {limit} bytes")
        self.limit = limit


class Incomplete(ImageStoreError):
    def __init__(self, expected: int, received: int):
        super().__init__(f"the upload ended after {received} of {expected} bytes")


@dataclass(frozen=True)
class Stored:
    """What ``put`` stored: its key, its size in bytes and ``sha256:<hex>``."""

    key: str
    size: int
    checksum: str


def _chunks(stream, length: int | None) -> Iterator[bytes]:
    """Read ``stream`` (anything with ``read(n)``) in bounded chunks until EOF or
    ``length`` bytes."""
    remaining = length
    while remaining is None or remaining > 0:
        chunk = stream.read(CHUNK if remaining is None else min(CHUNK, remaining))
        if not chunk:
            return
        if remaining is not None:
            remaining -= len(chunk)
        yield chunk


class _Meter:
    """Counts and hashes chunks as they pass; enforces the size limit."""

    def __init__(self, max_bytes: int | None):
        self.sha = hashlib.sha256()
        self.size = 0
        self.max_bytes = max_bytes

    def __call__(self, chunk: bytes) -> bytes:
        self.size += len(chunk)
        if self.max_bytes is not None and self.size > self.max_bytes:
            raise TooLarge(self.max_bytes)
        self.sha.update(chunk)
        return chunk

    def finish(self, key: str, *, expected: str, length: int | None) -> Stored:
        if length is not None and self.size != length:
            raise Incomplete(length, self.size)
        checksum = "sha256:" + self.sha.hexdigest()
        if expected and expected != checksum:
            raise ChecksumMismatch(expected, checksum)
        return Stored(key=key, size=self.size, checksum=checksum)


class ImageStore:
    """The contract; see the module's docstring for what every store guarantees."""

    def put(
        self,
        key: str,
        stream,
        *,
        length: int | None = None,
        expected_checksum: str = "",
        max_bytes: int | None = None,
    ) -> Stored:
        """Store ``stream`` (``read(n)``; read until EOF, or exactly ``length`` bytes)
        under ``key``."""
        raise NotImplementedError

    def open(self, key: str) -> Iterable[bytes]:
        """The object's bytes, in chunks."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def fetch_url(self, key: str, *, expires_s: int) -> str:
        """A URL a host can GET the object from for ``expires_s`` seconds; empty when
        this store offers none (the caller then serves ``open`` itself)."""
        raise NotImplementedError


def _safe_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ImageStoreError(f"bad key {key!r}")
    return key


class DirectoryStore(ImageStore):
    """Objects are files under ``root``; a put writes ``root/.partial/<random>`` and renames
    it into place (one file system, so the rename is atomic). ``file_urls``: hosts read
    ``root`` themselves (one machine, or a shared mount), so ``fetch_url`` is ``file://``."""

    def __init__(self, root: Path | str, *, file_urls: bool = True):
        self.root = Path(root)
        self.file_urls = file_urls

    def path(self, key: str) -> Path:
        return self.root / _safe_key(key)

    def put(self, key, stream, *, length=None, expected_checksum="", max_bytes=None) -> Stored:
        final = self.path(key)
        partial_dir = self.root / ".partial"
        partial_dir.mkdir(parents=True, exist_ok=True)
        partial = partial_dir / uuid.uuid4().hex
        meter = _Meter(max_bytes)
        try:
            with open(partial, "wb") as out:
                for chunk in _chunks(stream, length):
                    out.write(meter(chunk))
                out.flush()
                os.fsync(out.fileno())
            stored = meter.finish(key, expected=expected_checksum, length=length)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(partial, final)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return stored

    def open(self, key: str) -> Iterator[bytes]:
        try:
            f = open(self.path(key), "rb")  # noqa: SIM115 - closed when the generator ends
        except FileNotFoundError as e:
            raise ImageStoreError(f"no object {key}") from e
        with f:
            yield from _chunks(f, None)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def delete(self, key: str) -> None:
        path = self.path(key)
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the key's folder, once empty
            path.parent.rmdir()

    def fetch_url(self, key: str, *, expires_s: int) -> str:
        return f"file://{quote(str(self.path(key).resolve()))}" if self.file_urls else ""


class S3Store(ImageStore):
    """Objects in one bucket of an S3-compatible service (made on first use). A put is a
    multipart upload, completed only once the checksum holds and aborted on any failure,
    so no object appears under the key until it is whole."""

    def __init__(
        self,
        *,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        region: str = "us-east-1",
    ):
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=region
        )
        config = Config(
            retries={"max_attempts": 3},
            s3={"addressing_style": "path"},
            signature_version="s3v4",
        )
        self.s3 = session.client("s3", endpoint_url=endpoint, config=config)
        self.bucket = bucket
        self._bucket_ready = False

    def _call(self, what: str, fn, *args, ok: tuple[str, ...] = (), **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code", "") in ok:
                return None
            raise ImageStoreError(f"{what}: {e}") from e
        except BotoCoreError as e:
            raise ImageStoreError(f"{what}: {e}") from e

    def _ensure_bucket(self) -> None:
        if not self._bucket_ready:
            self._call(
                f"create bucket {self.bucket}",
                self.s3.create_bucket,
                Bucket=self.bucket,
                ok=("BucketAlreadyOwnedByYou", "BucketAlreadyExists"),
            )
            self._bucket_ready = True

    def put(self, key, stream, *, length=None, expected_checksum="", max_bytes=None) -> Stored:
        self._ensure_bucket()
        key = _safe_key(key)
        upload = self._call(
            f"start upload {key}", self.s3.create_multipart_upload, Bucket=self.bucket, Key=key
        )
        upload_id = upload["UploadId"]
        meter = _Meter(max_bytes)
        parts = []
        try:
            buffer = bytearray()

            def send(data: bytes) -> None:
                number = len(parts) + 1
                answer = self._call(
                    f"upload part {number} of {key}",
                    self.s3.upload_part,
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=data,
                )
                parts.append({"PartNumber": number, "ETag": answer["ETag"]})

            for chunk in _chunks(stream, length):
                buffer += meter(chunk)
                if len(buffer) >= S3_PART:
                    send(bytes(buffer))
                    buffer.clear()
            if buffer or not parts:
                send(bytes(buffer))
            stored = meter.finish(key, expected=expected_checksum, length=length)
            self._call(
                f"complete upload {key}",
                self.s3.complete_multipart_upload,
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            self._call(
                f"abort upload {key}",
                self.s3.abort_multipart_upload,
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                ok=("NoSuchUpload",),
            )
            raise
        return stored

    def open(self, key: str) -> Iterator[bytes]:
        answer = self._call(f"get {key}", self.s3.get_object, Bucket=self.bucket, Key=key)
        body = answer["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        return (
            self._call(
                f"head {key}",
                self.s3.head_object,
                Bucket=self.bucket,
                Key=key,
                ok=("404", "NoSuchKey", "NotFound"),
            )
            is not None
        )

    def delete(self, key: str) -> None:
        self._call(
            f"delete {key}",
            self.s3.delete_object,
            Bucket=self.bucket,
            Key=key,
            ok=("NoSuchKey", "NoSuchBucket"),
        )

    def fetch_url(self, key: str, *, expires_s: int) -> str:
        return self._call(
            f"presign {key}",
            self.s3.generate_presigned_url,
            "get_object",
            Params={"Bucket": self.bucket, "Key": key},
            ExpiresIn=expires_s,
        )
