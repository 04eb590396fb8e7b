from django.db import models


class VolumeTier(models.TextChoices):
    """Where a volume lives. ``local``: the NVMe pool of one host (bound to the host of the
    first VM it is attached to, and attachable only to VMs on that host from then on);
    ``shared``: the shared pool every host reaches."""

    LOCAL = "local", "Local NVMe (one host)"
    SHARED = "shared", "Shared (any host)"


class VolumeState(models.TextChoices):
    AVAILABLE = "available", "Available"  # attached to nothing
    IN_USE = "in_use", "In use"  # attached to a VM


class ShareTier(models.TextChoices):
    """mdx's file system tiers: ``fast`` (Lustre on NVMe, mounted at /fast) and ``large``
    (Lustre on HDD, at /large)."""

    FAST = "fast", "Fast (NVMe)"
    LARGE = "large", "Large (HDD)"


class ShareBackend(models.TextChoices):
    LUSTRE = "lustre", "Lustre (project quota)"
    NFS = "nfs", "NFS (a file system image per share)"


class UsageKind(models.TextChoices):
    VOLUME = "volume", "Block volume"
    SHARE = "share", "Shared file system"
    BUCKET = "bucket", "Object storage bucket"
