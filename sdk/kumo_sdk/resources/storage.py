"""Volumes, S3 buckets and access keys."""

from __future__ import annotations

from kumo_sdk.resource import CREATE, DELETE, READ, UPDATE, Resource
from kumo_sdk.types import AccessKey, Bucket, Share, Volume


class Volumes(Resource[Volume]):
    """A project's block volumes. Changes answer at once (no operation): an attached volume
    reaches a running guest at its next boot. ``create(name, size_gib=..., tier=...,
    description=...)`` counts against the storage quota at once (QuotaExceeded past it);
    ``tier`` is the server's default (shared) unless given. ``list`` filters: ``state``,
    ``tier``. Deleting an attached volume answers Conflict."""

    path, type, uuid_key = "volumes/", Volume, True
    verbs = READ | {CREATE, DELETE}

    def attach(self, volume_id: str, vm: str, *, project: str | None = None) -> Volume:
        """Attach the volume to ``vm`` (a VM id of the project, placed: provisioning, running
        or stopped) as its next free disk; Conflict when either is not in a state for it."""
        return self._decode(self._action(volume_id, "attach", {"vm": vm}, project=project))

    def detach(self, volume_id: str, *, project: str | None = None) -> Volume:
        """Detach an attached volume (Conflict when it is not); its data stays."""
        return self._decode(self._action(volume_id, "detach", project=project))

    def extend(self, volume_id: str, size_gib: int, *, project: str | None = None) -> Volume:
        """Grow the volume to ``size_gib`` (never shrink it)."""
        body = {"size_gib": size_gib}
        return self._decode(self._action(volume_id, "extend", body, project=project))


class Buckets(Resource[Bucket]):
    """A project's S3 buckets, named as in S3 (names are global: a taken one is Conflict);
    ``create(name, quota_gib=...)``. Deleting one deletes everything it holds. Without an
    object store on the server every call answers Conflict."""

    path, type, key, find_by = "buckets/", Bucket, "name", None
    verbs = READ | {CREATE, UPDATE, DELETE}


class AccessKeys(Resource[AccessKey]):
    """A project's S3 access keys (they reach every bucket of the project); project admins
    make and delete them. ``create(description=...)``: the secret is in
    ``.secret_access_key``, in that answer only. ``delete`` takes the numeric ``id``: the key
    stops working at once. ``find`` matches the access key id."""

    path, type, find_by, create_args = "access-keys/", AccessKey, "access_key_id", ()
    verbs = READ | {CREATE, DELETE}
    noun = "access key"


class Shares(Resource[Share]):
    """Shared file systems: ``create(name, tier=..., quota_gib=...)`` (tier ``fast`` or
    ``large``; Conflict when the server serves no such tier), ``extend(id, quota_gib)``.
    Guests booted after a share is ``ready`` mount it; others run its ``mount_command``."""

    path, type, uuid_key = "shares/", Share, True
    verbs = READ | {CREATE, DELETE}

    def extend(self, share_id: str, quota_gib: int, *, project: str | None = None) -> Share:
        """Grow the share's quota to ``quota_gib``."""
        body = {"quota_gib": quota_gib}
        return self._decode(self._action(share_id, "extend", body, project=project))
