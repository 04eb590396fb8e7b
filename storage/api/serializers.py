from django.conf import settings
from rest_framework import serializers

from controlplane.api import fields
from controlplane.validators import hostname_validator
from storage.choices import ShareTier, VolumeTier
from storage.models import AccessKey, Bucket, Share, Volume, bucket_name_validator
from storage.selectors import FSTYPES, mount_command

NAME = {"max_length": 63}
MAX_GIB = 1_048_576  # 1 PiB: past it a number is a typo


class VolumeSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    vm = serializers.UUIDField(source="vm_id", read_only=True, allow_null=True)
    host = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    guest_path = serializers.SerializerMethodField()

    class Meta:
        model = Volume
        fields = [
            "id",
            "project",
            "name",
            "description",
            "size_gib",
            "tier",
            "state",
            "vm",
            "device",
            "guest_path",
            "host",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_guest_path(self, volume) -> str:
        """Where the guest finds the disk, whatever name its kernel gives it."""
        return f"/dev/disk/by-id/virtio-{volume.serial}"


class VolumeCreateSerializer(serializers.Serializer):
    name = fields.CharField(validators=[hostname_validator], **NAME)
    description = fields.CharField(max_length=200, required=False, default="", allow_blank=True)
    size_gib = serializers.IntegerField(min_value=1, max_value=MAX_GIB)
    tier = serializers.ChoiceField(choices=VolumeTier.choices, default=VolumeTier.SHARED)


class VolumeAttachSerializer(serializers.Serializer):
    vm = serializers.UUIDField(help_text="the id of a VM of this project")


class VolumeExtendSerializer(serializers.Serializer):
    size_gib = serializers.IntegerField(min_value=1, max_value=MAX_GIB)


class ShareSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    ready = serializers.BooleanField(read_only=True)
    fstype = serializers.SerializerMethodField()
    mount_command = serializers.SerializerMethodField()

    class Meta:
        model = Share
        fields = [
            "id",
            "project",
            "name",
            "tier",
            "backend",
            "quota_gib",
            "used_bytes",
            "usage_at",
            "mount_source",
            "mount_point",
            "fstype",
            "mount_command",
            "ready",
            "last_error",
            "created_at",
        ]
        read_only_fields = fields

    def get_fstype(self, share) -> str:
        return FSTYPES[share.backend]

    def get_mount_command(self, share) -> str:
        """What a guest runs to mount the share by hand (guests made after the share is
        ready mount it at boot through cloud-init)."""
        return mount_command(share)


class ShareCreateSerializer(serializers.Serializer):
    name = fields.CharField(validators=[hostname_validator], **NAME)
    tier = serializers.ChoiceField(choices=ShareTier.choices)
    quota_gib = serializers.IntegerField(min_value=1, max_value=MAX_GIB)


class ShareExtendSerializer(serializers.Serializer):
    quota_gib = serializers.IntegerField(min_value=1, max_value=MAX_GIB)


class BucketSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    endpoint = serializers.SerializerMethodField()

    class Meta:
        model = Bucket
        fields = [
            "name",
            "project",
            "quota_gib",
            "used_bytes",
            "usage_at",
            "endpoint",
            "created_at",
        ]
        read_only_fields = fields

    def get_endpoint(self, bucket) -> str:
        """The S3 endpoint clients use with the project's access keys."""
        return settings.OBJECT_STORE["endpoint"]


class BucketCreateSerializer(serializers.Serializer):
    name = fields.CharField(min_length=3, validators=[bucket_name_validator], **NAME)
    quota_gib = serializers.IntegerField(min_value=1, max_value=MAX_GIB)


class BucketUpdateSerializer(serializers.Serializer):
    quota_gib = serializers.IntegerField(min_value=1, max_value=MAX_GIB, required=False)


class AccessKeySerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = AccessKey
        fields = ["id", "project", "access_key_id", "description", "created_by", "created_at"]
        read_only_fields = fields


class AccessKeyCreateSerializer(serializers.Serializer):
    description = fields.CharField(max_length=200, required=False, default="", allow_blank=True)


class AccessKeyCreatedSerializer(AccessKeySerializer):
    """The answer to a create: the only time the secret is shown."""

    secret_access_key = serializers.CharField(read_only=True)
    endpoint = serializers.SerializerMethodField()

    class Meta(AccessKeySerializer.Meta):
        fields = [*AccessKeySerializer.Meta.fields, "secret_access_key", "endpoint"]
        read_only_fields = fields

    def get_endpoint(self, key) -> str:
        return settings.OBJECT_STORE["endpoint"]
