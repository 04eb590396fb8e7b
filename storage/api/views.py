"""The storage API. Every project endpoint reads through the project-scoped queryset
(``ProjectScopedViewSet``) and writes through ``storage.services``; a VM named in a
request is looked up in the caller's project only, so another project's VM answers 400
exactly like a missing one."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.response import Response

from compute.models import VirtualMachine
from controlplane.api.viewsets import OperatorViewSet, ServiceViewSet
from controlplane.errors import InvalidInput
from storage import services
from storage.api import serializers as s
from storage.models import AccessKey, Bucket, Share, Volume
from tenants.choices import Role

UUID = r"[0-9a-fA-F-]{36}"


class VolumeViewSet(ServiceViewSet):
    """The project's block volumes: create, attach to a VM (``attach``), ``detach``,
    ``extend``, delete (409 while attached)."""

    model = Volume
    serializer_class = s.VolumeSerializer
    ordering_fields = ["name", "created_at", "size_gib"]
    filterset_fields = ["state", "tier"]
    audit_object_type = "storage.volume"
    lookup_value_regex = UUID

    def get_queryset(self):
        return super().get_queryset().select_related("project", "host")

    @extend_schema(request=s.VolumeCreateSerializer, responses={201: s.VolumeSerializer})
    def create(self, request, project_slug=None):
        volume = services.volume_create(
            project=self.project, **self._input(s.VolumeCreateSerializer)
        )
        return self._answer(volume, status=201)

    @extend_schema(request=s.VolumeAttachSerializer, responses={200: s.VolumeSerializer})
    @action(detail=True, methods=["post"])
    def attach(self, request, project_slug=None, pk=None):
        volume = self.get_object()  # first: another project's volume is 404 whatever the body
        vm_id = self._input(s.VolumeAttachSerializer)["vm"]
        vm = VirtualMachine.objects.for_project(self.project).filter(pk=vm_id).first()
        if vm is None:
            raise InvalidInput.field("vm", f"no VM {vm_id} in this project")
        return self._answer(services.volume_attach(volume=volume, vm=vm))

    @extend_schema(request=None, responses={200: s.VolumeSerializer})
    @action(detail=True, methods=["post"])
    def detach(self, request, project_slug=None, pk=None):
        return self._answer(services.volume_detach(volume=self.get_object()))

    @extend_schema(request=s.VolumeExtendSerializer, responses={200: s.VolumeSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request, project_slug=None, pk=None):
        volume = self.get_object()
        size = self._input(s.VolumeExtendSerializer)["size_gib"]
        return self._answer(services.volume_extend(volume=volume, size_gib=size))

    def perform_destroy(self, instance):
        services.volume_delete(volume=instance)


class ShareViewSet(ServiceViewSet):
    """The project's shared file systems (Lustre /fast and /large, or NFS): a directory
    with a hard quota, mounted by the project's guests. ``mount_command`` says how to mount
    one by hand; guests booted once it is ready mount it themselves."""

    model = Share
    serializer_class = s.ShareSerializer
    ordering_fields = ["name", "created_at"]
    filterset_fields = ["tier"]
    audit_object_type = "storage.share"
    lookup_value_regex = UUID

    def get_queryset(self):
        return super().get_queryset().select_related("project")

    @extend_schema(request=s.ShareCreateSerializer, responses={201: s.ShareSerializer})
    def create(self, request, project_slug=None):
        share = services.share_create(project=self.project, **self._input(s.ShareCreateSerializer))
        return self._answer(share, status=201)

    @extend_schema(request=s.ShareExtendSerializer, responses={200: s.ShareSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request, project_slug=None, pk=None):
        share = self.get_object()
        quota = self._input(s.ShareExtendSerializer)["quota_gib"]
        return self._answer(services.share_extend(share=share, quota_gib=quota))

    def perform_destroy(self, instance):
        services.share_delete(share=instance)


class BucketViewSet(mixins.UpdateModelMixin, ServiceViewSet):
    """The project's S3 buckets, reached with the project's access keys at ``endpoint``.
    Deleting a bucket deletes what it holds."""

    model = Bucket
    serializer_class = s.BucketSerializer
    ordering_fields = ["name", "created_at"]
    audit_object_type = "storage.bucket"
    lookup_field = "name"
    lookup_value_regex = r"[^/]+"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return super().get_queryset().select_related("project")

    @extend_schema(request=s.BucketCreateSerializer, responses={201: s.BucketSerializer})
    def create(self, request, project_slug=None):
        bucket = services.bucket_create(
            project=self.project, **self._input(s.BucketCreateSerializer)
        )
        return self._answer(bucket, status=201)

    @extend_schema(request=s.BucketUpdateSerializer, responses={200: s.BucketSerializer})
    def partial_update(self, request, project_slug=None, name=None):
        bucket = self.get_object()
        quota = self._input(s.BucketUpdateSerializer).get("quota_gib")
        if quota is not None:
            bucket = services.bucket_update(bucket=bucket, quota_gib=quota)
        return self._answer(bucket)

    def perform_destroy(self, instance):
        services.bucket_delete(bucket=instance)


class AccessKeyViewSet(ServiceViewSet):
    """The project's S3 access keys. The secret is in the answer to the create and
    nowhere else; project admins make and revoke keys (they reach every bucket)."""

    model = AccessKey
    serializer_class = s.AccessKeySerializer
    ordering_fields = ["created_at"]
    audit_object_type = "storage.accesskey"
    write_role = Role.ADMIN

    def get_queryset(self):
        return super().get_queryset().select_related("project", "created_by")

    @extend_schema(
        request=s.AccessKeyCreateSerializer, responses={201: s.AccessKeyCreatedSerializer}
    )
    def create(self, request, project_slug=None):
        key, secret = services.access_key_create(
            project=self.project,
            actor=request.user,
            **self._input(s.AccessKeyCreateSerializer),
        )
        key = self.get_queryset().get(pk=key.pk)
        key.secret_access_key = secret
        body = s.AccessKeyCreatedSerializer(key, context=self.get_serializer_context()).data
        return Response(body, status=201)

    def perform_destroy(self, instance):
        services.access_key_delete(key=instance)


# --- operators --------------------------------------------------------------------------------


class _OperatorList(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    pass


class OperatorVolumeViewSet(_OperatorList):
    """Every project's volumes, where they live and what holds them."""

    queryset = Volume.objects.select_related("project", "host")
    serializer_class = s.VolumeSerializer
    filterset_fields = ["state", "tier"]
    lookup_value_regex = UUID


class OperatorShareViewSet(_OperatorList):
    """Every project's shares, their file system project ids, usage and last errors."""

    queryset = Share.objects.select_related("project")
    serializer_class = s.ShareSerializer
    filterset_fields = ["tier", "backend"]
    lookup_value_regex = UUID


class OperatorBucketViewSet(_OperatorList):
    """Every project's buckets and their last measured usage."""

    queryset = Bucket.objects.select_related("project")
    serializer_class = s.BucketSerializer
    lookup_field = "name"
    lookup_value_regex = r"[^/]+"
