"""Images as a service: their records, their bytes in the image store, and how hosts fetch
them.

An image is made in two steps, as Glance makes them: ``image_register`` writes the record
(``uploading``), then ``image_upload`` streams its bytes into the store while the store
computes the SHA-256 and size; the image turns ``active``, or ``failed`` with the reason,
and a failed upload leaves nothing in the store. ``image_import`` does both from a local
file (``manage.py image-build`` calls it). ``image_delete`` refuses (409) while a VM that
is not deleted uses the image, and removes its bytes from the store.

Hosts never read the database or the store's credentials: ``image_fetch`` gives what the
controller puts in a guest's ``VmApply`` (checksum, size, a URL the host can GET).
"""

from __future__ import annotations

import functools
import logging
import uuid
from pathlib import Path

from django.conf import settings
from django.core import signing
from django.db import transaction

from compute.choices import ImageFormat, ImageState, Visibility, VmState
from compute.drivers import imagestore
from compute.drivers.imagecache import file_sha256
from compute.models import Image, VirtualMachine
from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import Conflict, InvalidInput, KumoError
from tenants.models import Project

log = logging.getLogger(__name__)

FILE_URL_SALT = "kumo.image-file"
_CHECKSUM_PREFIX = "sha256:"


class PayloadTooLarge(KumoError):
    status = 413
    code = "too_large"


@functools.cache
def _store(kind, root, file_urls, bucket, endpoint, access, secret, region):
    if kind == "dir":
        return imagestore.DirectoryStore(root, file_urls=file_urls)
    if kind == "s3":
        return imagestore.S3Store(
            endpoint=endpoint, access_key=access, secret_key=secret, bucket=bucket, region=region
        )
    raise ValueError(f"KUMO_IMAGE_STORE={kind!r}: want dir or s3")


def image_store() -> imagestore.ImageStore:
    """The configured image store (``settings.IMAGE_STORE``)."""
    cfg, obj = settings.IMAGE_STORE, settings.OBJECT_STORE
    return _store(
        cfg["kind"],
        cfg["dir"],
        not settings.IMAGE_FETCH_BASE_URL,
        cfg["bucket"],
        obj["endpoint"],
        obj["access_key"],
        obj["secret_key"],
        obj["region"],
    )


def _check_fields(*, format: str, checksum: str, login_user: str) -> None:
    if format not in ImageFormat.values:
        raise InvalidInput.field("format", f"must be one of {', '.join(ImageFormat.values)}")
    if checksum and not (
        checksum.startswith(_CHECKSUM_PREFIX)
        and len(checksum) == 71
        and all(c in "0123456789abcdef" for c in checksum[7:])
    ):
        raise InvalidInput.field("checksum", "must be sha256: and 64 lower-case hex digits")
    if login_user and not login_user.replace("-", "").replace("_", "").isalnum():
        raise InvalidInput.field("login_user", "must be a user name (letters, digits, - and _)")


@transaction.atomic
def image_register(
    *,
    name: str,
    os_distro: str,
    format: str,
    project: Project | None = None,
    os_version: str = "",
    description: str = "",
    min_disk_gib: int = 0,
    min_memory_gib: int = 0,
    login_user: str = "",
    checksum: str = "",
) -> Image:
    """The record of an image whose bytes are to be uploaded (``uploading``): public when
    ``project`` is None (operators), else the project's. ``checksum``, if given, is what
    the upload must match."""
    _check_fields(format=format, checksum=checksum, login_user=login_user)
    image = Image.objects.create(
        name=name,
        os_distro=os_distro,
        os_version=os_version,
        format=format,
        description=description,
        min_disk_gib=min_disk_gib,
        min_memory_gib=min_memory_gib,
        login_user=login_user,
        checksum=checksum,
        state=ImageState.UPLOADING,
        visibility=Visibility.PROJECT if project else Visibility.PUBLIC,
        project=project,
    )
    audit.record("image.create", image, project=project, detail={"format": format})
    return image


def _fail(image: Image, reason: str) -> None:
    with transaction.atomic():
        Image.objects.filter(pk=image.pk, state=ImageState.UPLOADING).update(
            state=ImageState.FAILED, state_reason=reason[:500]
        )
        audit.record(
            "image.upload",
            image,
            project=image.project,
            outcome=AuditOutcome.FAILED,
            detail={"reason": reason[:200]},
        )
    image.state, image.state_reason = ImageState.FAILED, reason[:500]


def image_upload(*, image: Image, stream, length: int | None) -> Image:
    """Stream the bytes of ``image`` (``uploading``) from ``stream`` (``read(n)``; exactly
    ``length`` bytes, or to EOF when None) into the store. On success the image is
    ``active`` with its checksum and size; a short or empty body, a checksum that differs
    from the one registered or an image over ``KUMO_IMAGE_MAX_BYTES`` turns it ``failed``
    (400, 413) and leaves nothing in the store. Not in a transaction: the bytes may take
    minutes; the state changes are conditional UPDATEs, so of two racing uploads one wins,
    the other gets 409 and removes what it stored."""
    if image.state != ImageState.UPLOADING:
        raise Conflict(
            f"image {image.name} is {image.state}; only an uploading image takes bytes",
            details={"state": [image.state]},
        )
    if length is not None and length > settings.IMAGE_MAX_BYTES:
        _fail(image, f"{length} bytes is over the limit of {settings.IMAGE_MAX_BYTES}")
        raise PayloadTooLarge(
            f"the image is larger than {settings.IMAGE_MAX_BYTES} bytes",
            details={"file": ["too large"]},
        )
    store = image_store()
    key = f"images/{image.pk}/{uuid.uuid4().hex}"
    try:
        stored = store.put(
            key,
            stream,
            length=length,
            expected_checksum=image.checksum,
            max_bytes=settings.IMAGE_MAX_BYTES,
        )
    except imagestore.TooLarge as e:
        _fail(image, str(e))
        raise PayloadTooLarge(str(e), details={"file": ["too large"]}) from None
    except imagestore.ChecksumMismatch as e:
        _fail(image, str(e))
        raise InvalidInput.field("checksum", str(e)) from None
    except imagestore.ImageStoreError as e:
        _fail(image, str(e))
        raise InvalidInput.field("file", str(e)) from None
    except OSError as e:  # the client went away mid-body
        _fail(image, f"the upload broke off: {e}")
        raise InvalidInput.field("file", f"the upload broke off: {e}") from None
    if stored.size == 0:
        store.delete(stored.key)
        _fail(image, "the upload was empty")
        raise InvalidInput.field("file", "is empty")
    with transaction.atomic():
        won = Image.objects.filter(pk=image.pk, state=ImageState.UPLOADING).update(
            state=ImageState.ACTIVE,
            location=stored.key,
            checksum=stored.checksum,
            size_bytes=stored.size,
            state_reason="",
        )
        if not won:
            transaction.on_commit(lambda: store.delete(stored.key))
            image.refresh_from_db()
            raise Conflict(
                f"image {image.name} is {image.state}: another upload finished first",
                details={"state": [image.state]},
            )
        image.refresh_from_db()
        audit.record(
            "image.upload",
            image,
            project=image.project,
            detail={"checksum": stored.checksum, "size_bytes": stored.size},
        )
    log.info("image %s: stored %d bytes, %s", image.pk, stored.size, stored.checksum)
    return image


def _in_use(image: Image):
    return VirtualMachine.objects.filter(image=image).exclude(state=VmState.DELETED)


@transaction.atomic
def image_delete(*, image: Image) -> None:
    """Delete an image no VM uses (409 naming the VMs otherwise): it is hidden at once and
    its bytes leave the store after commit. The record stays (``deleted``) for the VMs
    that were booted from it."""
    image = Image.objects.select_for_update().get(pk=image.pk)
    if image.state == ImageState.DELETED:
        return
    users = _in_use(image)
    if users.exists():
        names = ", ".join(users.order_by("name").values_list("name", flat=True)[:5])
        raise Conflict(
            f"image {image.name} is in use by VMs: {names}",
            details={"vms": [str(users.count())]},
        )
    key = image.location
    Image.objects.filter(pk=image.pk).update(state=ImageState.DELETED)
    image.state = ImageState.DELETED
    audit.record("image.delete", image, project=image.project)
    if key and not key.startswith("/"):
        transaction.on_commit(lambda: image_store().delete(key))


def image_import(
    *,
    source_path: str | Path,
    name: str,
    disk_format: str,
    os_distro: str,
    os_version: str = "",
    login_user: str = "",
    visibility: str = Visibility.PUBLIC,
    project: Project | None = None,
    actor=None,
    description: str = "",
    min_disk_gib: int = 0,
    min_memory_gib: int = 0,
) -> Image:
    """Register the local file ``source_path`` as an image (streamed into the store), and
    return it. Idempotent on (name, checksum) within its visibility: an active image of
    that name and content is returned as it is, not made twice."""
    if (visibility == Visibility.PROJECT) != (project is not None):
        raise InvalidInput.field("visibility", "project images need a project; public, none")
    path = Path(source_path)
    if not path.is_file():
        raise InvalidInput.field("source_path", f"{path} is not a file")
    checksum, size = file_sha256(path)
    with audit.audit_context(**({"actor": actor} if actor is not None else {})):
        existing = Image.objects.filter(
            name=name,
            checksum=checksum,
            project=project,
            visibility=visibility,
            state=ImageState.ACTIVE,
        ).first()
        if existing is not None:
            return existing
        image = image_register(
            name=name,
            os_distro=os_distro,
            os_version=os_version,
            format=disk_format,
            project=project,
            description=description,
            min_disk_gib=min_disk_gib,
            min_memory_gib=min_memory_gib,
            login_user=login_user,
            checksum=checksum,
        )
        with open(path, "rb") as f:
            return image_upload(image=image, stream=f, length=size)


# --- how hosts fetch an image ----------------------------------------------------------------


def file_token(image: Image) -> str:
    """A signed token naming ``image``'s stored bytes (``image_file_for_token`` reads it)."""
    return signing.dumps({"image": str(image.pk), "key": image.location}, salt=FILE_URL_SALT)


def image_file_for_token(token: str) -> str | None:
    """The store key a token from ``file_token`` names, if it is genuine, not older than
    ``KUMO_IMAGE_URL_TTL_S`` and its image is not deleted; else None."""
    try:
        data = signing.loads(token, salt=FILE_URL_SALT, max_age=settings.IMAGE_URL_TTL_S)
    except signing.BadSignature:
        return None
    alive = Image.objects.filter(
        pk=data.get("image"), location=data.get("key"), state=ImageState.ACTIVE
    ).exists()
    return data["key"] if alive else None


def image_fetch(image: Image) -> dict:
    """What a host needs to fetch ``image`` into its cache (``VmApply``'s image fields):
    ``image_url`` empty when the image is pre-staged on every host at its location."""
    if not image.location or image.location.startswith("/"):
        return {"image_url": "", "image_checksum": image.checksum, "image_size": image.size_bytes}
    store = image_store()
    url = store.fetch_url(image.location, expires_s=settings.IMAGE_URL_TTL_S)
    if not url:
        url = f"{settings.IMAGE_FETCH_BASE_URL}/api/v1/image-files/{file_token(image)}"
    return {"image_url": url, "image_checksum": image.checksum, "image_size": image.size_bytes}
