"""Writes to templates and images (operators', and projects' own images) and to placement
groups (a project's)."""

import re

from django.db import IntegrityError, transaction

from compute.choices import (
    EvictAction,
    ImageFormat,
    ImageState,
    PlacementPolicy,
    Visibility,
    VmState,
)
from compute.models import Image, PlacementGroup, Template, VirtualMachine
from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from tenants.models import Project

_CHECKSUM_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


@transaction.atomic
def template_create(
    *,
    name: str,
    vcpus: int,
    memory_gib: int,
    gpus: int = 0,
    gpu_model: str = "",
    disk_gib: int = 40,
    spot_allowed: bool = True,
    description: str = "",
    eviction_notice_s: int = 30,
    evict_action: str = "stop",
) -> Template:
    """A new VM size. GPU templates take 1, 2, 4 or 8 GPUs of one named model; spot VMs of
    it get ``eviction_notice_s`` of notice before eviction, then are evicted or, with
    ``evict_action="shelve"``, shelved (their root disk kept for unshelve)."""
    if evict_action not in EvictAction.values:
        raise InvalidInput.field("evict_action", f"must be one of {', '.join(EvictAction.values)}")
    if gpus not in (0, 1, 2, 4, 8):
        raise InvalidInput.field("gpus", "must be 0, 1, 2, 4 or 8")
    if gpus and not gpu_model:
        raise InvalidInput.field("gpu_model", "required when gpus is not 0")
    if Template.objects.filter(name=name).exists():
        raise Conflict(f"template {name!r} exists", details={"name": ["taken"]})
    template = Template.objects.create(
        name=name,
        vcpus=vcpus,
        memory_gib=memory_gib,
        gpus=gpus,
        gpu_model=gpu_model if gpus else "",
        disk_gib=disk_gib,
        spot_allowed=spot_allowed,
        description=description,
        eviction_notice_s=eviction_notice_s,
        evict_action=evict_action,
    )
    audit.record("template.create", template, detail={"vcpus": vcpus, "gpus": gpus})
    return template


@transaction.atomic
def template_update(
    *, template: Template, active: bool | None = None, description: str | None = None
) -> Template:
    """Offer or withdraw a template. Sizes never change: VMs copied them at create."""
    changes = {
        k: v for k, v in {"active": active, "description": description}.items() if v is not None
    }
    for name, value in changes.items():
        setattr(template, name, value)
    if changes:
        template.save(update_fields=list(changes))
        audit.record("template.update", template, detail=changes)
    return template


@transaction.atomic
def image_create(
    *,
    name: str,
    os_distro: str,
    format: str,
    location: str,
    checksum: str,
    project: Project | None = None,
    os_version: str = "",
    description: str = "",
    size_bytes: int = 0,
    min_disk_gib: int = 0,
    min_memory_gib: int = 0,
    login_user: str = "",
) -> Image:
    """Register an image already on every host at ``location`` (pre-staged; simulated
    hosts read no disk, so their images are only this): active at once, public when
    ``project`` is None, else the project's. Images uploaded through Kumo are made by
    ``compute.services.images`` instead."""
    if format not in ImageFormat.values:
        raise InvalidInput.field("format", f"must be one of {', '.join(ImageFormat.values)}")
    if not _CHECKSUM_RE.match(checksum):
        raise InvalidInput.field("checksum", "must be sha256: and 64 lower-case hex digits")
    if not location.startswith("/"):
        raise InvalidInput.field("location", "must be an absolute path on the hosts' store")
    image = Image.objects.create(
        name=name,
        os_distro=os_distro,
        os_version=os_version,
        format=format,
        location=location,
        checksum=checksum,
        description=description,
        size_bytes=size_bytes,
        min_disk_gib=min_disk_gib,
        min_memory_gib=min_memory_gib,
        login_user=login_user,
        state=ImageState.ACTIVE,
        visibility=Visibility.PROJECT if project else Visibility.PUBLIC,
        project=project,
    )
    audit.record("image.create", image, project=project, detail={"location": location})
    return image


@transaction.atomic
def placement_group_create(*, project: Project, name: str, policy: str) -> PlacementGroup:
    if policy not in PlacementPolicy.values:
        raise InvalidInput.field("policy", f"must be one of {', '.join(PlacementPolicy.values)}")
    try:
        with transaction.atomic():
            group = PlacementGroup.objects.create(project=project, name=name, policy=policy)
    except IntegrityError:
        raise Conflict(
            f"placement group {name!r} exists in project {project.slug}",
            details={"name": ["taken"]},
        ) from None
    audit.record("placement_group.create", group, project=project, detail={"policy": policy})
    return group


@transaction.atomic
def placement_group_delete(*, group: PlacementGroup) -> None:
    """Delete an empty group; one that still has VMs answers 409."""
    live = VirtualMachine.objects.filter(placement_group=group).exclude(state=VmState.DELETED)
    if live.exists():
        names = ", ".join(live.values_list("name", flat=True)[:5])
        raise Conflict(
            f"placement group {group.name} still has VMs: {names}",
            details={"vms": [str(live.count())]},
        )
    VirtualMachine.objects.filter(placement_group=group).update(placement_group=None)
    audit.record("placement_group.delete", group, project=group.project)
    group.delete()
