"""Kumo's own guest image (``compute.imagebuild``) in the catalogue: registered once as a
public image, found again by its checksum.

It registers the cached file where it lies (hosts on this machine read it from there), as
a pre-staged image; importing it into the image store (``compute.services.images.
image_import``) instead would let hosts elsewhere fetch it.
"""

from __future__ import annotations

from django.db import transaction

from compute.choices import ImageState
from compute.imagebuild import DISK_GIB, BuiltImage, cached_image
from compute.models import Image
from compute.services.catalog import image_create
from controlplane import audit
from controlplane.choices import AuditSource

IMAGE_NAME = "debian-12-kumo"


@transaction.atomic
def guest_image_register(*, built: BuiltImage) -> tuple[Image, bool]:
    """The public image for ``built``: the active one with its checksum, else a new one.
    Returns (image, created). Idempotent."""
    found = Image.objects.filter(
        checksum=built.checksum, project__isnull=True, state=ImageState.ACTIVE
    )
    image = found.first()
    if image is not None:
        return image, False
    with audit.audit_context(source=AuditSource.SYSTEM):
        image = image_create(
            name=IMAGE_NAME,
            description="Debian 12, cloud-init and OpenSSH, built by Kumo from Debian's archive",
            os_distro="debian",
            os_version="12",
            format="qcow2",
            location=str(built.path),
            checksum=built.checksum,
            size_bytes=built.size_bytes,
            min_disk_gib=DISK_GIB,
            login_user="debian",
        )
    return image, True


def guest_image_register_cached() -> Image | None:
    """Register the cached guest image if one was built for today's recipe (``make run``
    offers it then); None when there is none. Builds nothing."""
    built = cached_image()
    if built is None:
        return None
    return guest_image_register(built=built)[0]
