"""Block volumes, shared file systems, object storage buckets and access keys, and the
usage intervals billing rates them from.

Host work is keyed on (object id, generation) like a VM's: a volume is realized by the
agent of the host its VM runs on (it travels in the VM's ``vm_apply``), a share by the
agent of the host that serves its tier. Object storage is one central service, driven
by the controller.
"""

import uuid

from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from compute.models import Host, VirtualMachine
from controlplane.validators import hostname_validator
from storage.choices import ShareBackend, ShareTier, UsageKind, VolumeState, VolumeTier
from tenants.models import ProjectOwnedModel

bucket_name_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$",
    "3 to 63 characters: lower-case letters, digits and hyphens, starting and ending with a "
    "letter or digit.",
)


class Volume(ProjectOwnedModel):
    """A block device of ``size_gib`` that attaches to one VM at a time as ``device``
    (``vdb`` on). A ``local`` volume lives in the NVMe pool of ``host``, set when it is first
    attached, and attaches only to VMs on that host from then on; a ``shared`` one lives in
    the shared pool. It is realized by the agent of its VM's host, named ``vol-<id>``.
    ``realized_host`` is the host whose pool holds it (where a delete is sent)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63, validators=[hostname_validator])
    description = models.CharField(max_length=200, blank=True)
    size_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    tier = models.CharField(max_length=8, choices=VolumeTier.choices, default=VolumeTier.SHARED)
    state = models.CharField(
        max_length=12, choices=VolumeState.choices, default=VolumeState.AVAILABLE
    )
    vm = models.ForeignKey(
        VirtualMachine, null=True, blank=True, on_delete=models.SET_NULL, related_name="volumes"
    )
    device = models.CharField(max_length=8, blank=True, help_text="guest disk, e.g. vdb")
    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_volume_name"),
            models.UniqueConstraint(
                fields=["vm", "device"], condition=Q(vm__isnull=False), name="unique_vm_device"
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.size_gib} GiB {self.tier})"

    @property
    def volume_name(self) -> str:
        return f"vol-{self.pk.hex}"

    @property
    def serial(self) -> str:
        """The disk's serial (virtio allows 20 characters): the guest finds it as
        /dev/disk/by-id/virtio-<serial>."""
        return self.pk.hex[:20]


class Share(ProjectOwnedModel):
    """A project's directory on a shared file system tier with a hard limit of
    ``quota_gib``, realized by the agent of the host serving that tier. ``project_number``
    is the file system's project id for it (unique: the Lustre project quota's key).
    ``applied_generation`` is the newest ``generation`` that host reported applied."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63, validators=[hostname_validator])
    tier = models.CharField(max_length=8, choices=ShareTier.choices)
    backend = models.CharField(max_length=8, choices=ShareBackend.choices)
    quota_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    project_number = models.PositiveIntegerField(unique=True)
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="+")
    mount_source = models.CharField(max_length=300)
    mount_point = models.CharField(max_length=200)
    generation = models.PositiveIntegerField(default=1)
    applied_generation = models.PositiveIntegerField(default=0)
    used_bytes = models.PositiveBigIntegerField(default=0)
    usage_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_share_name")
        ]

    def __str__(self):
        return f"{self.name} ({self.tier}, {self.quota_gib} GiB)"

    @property
    def directory(self) -> str:
        return f"{self.project.slug}-{self.name}"

    @property
    def ready(self) -> bool:
        return self.applied_generation >= self.generation


class Bucket(ProjectOwnedModel):
    """An S3 bucket owned by its project's object store user; only that project's access
    keys reach it. ``used_bytes`` is the last usage read from the service."""

    name = models.CharField(max_length=63, unique=True, validators=[bucket_name_validator])
    quota_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    used_bytes = models.PositiveBigIntegerField(default=0)
    usage_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class AccessKey(ProjectOwnedModel):
    """An S3 access key of the project's object store user. The secret is shown once, in
    the answer to its creation; Kumo keeps only the key id."""

    access_key_id = models.CharField(max_length=128, unique=True)
    description = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        "tenants.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return self.access_key_id


class StorageUsage(ProjectOwnedModel):
    """One billable interval: object ``object_id`` of ``kind`` held ``gib`` from
    ``started_at`` until ``ended_at`` (open while it still does). A size change closes the
    interval and opens the next at the same instant, so intervals of one object never
    overlap and leave no gap."""

    kind = models.CharField(max_length=8, choices=UsageKind.choices)
    object_id = models.CharField(max_length=64)
    gib = models.DecimalField(max_digits=14, decimal_places=3)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [models.Index(fields=["project", "started_at"], name="storage_usage_project")]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "object_id"],
                condition=Q(ended_at__isnull=True),
                name="one_open_storage_usage",
            )
        ]

    def __str__(self):
        return f"{self.kind} {self.object_id} {self.gib} GiB from {self.started_at}"
