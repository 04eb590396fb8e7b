"""The guest metadata endpoint: what a guest asks about itself, authenticated by its token.

Each VM gets a token (``VirtualMachine.metadata_token``) in its cloud-init seed
(``/etc/kumo/metadata.env``, readable by root only). A guest sends it as header
``X-Kumo-Metadata-Token``; it names that VM and grants nothing else. Like AWS's spot
``instance-action``:

- ``GET /api/v1/metadata/spot/instance-action``: ``{"action": "stop", "time": …}`` when the
  VM has an eviction notice (or reclamation announced a stop or a deletion: ``terminate``),
  404 when nothing is scheduled;
- ``POST /api/v1/metadata/spot/acknowledge``: the guest is ready ("checkpoint done, take it
  now"): the notice ends at once. 404 when there is no notice.
- ``POST /api/v1/metadata/spot/checkpoint``: the guest saved its work; preemption then
  counts what an eviction would lose from now (``compute.services.spot.checkpoint_report``).
  ``{"checkpointed_at": …, "checkpoint_interval_s": …}``; 409 when the VM is not running.
"""

import hmac

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import authentication, exceptions, permissions
from rest_framework.response import Response
from rest_framework.views import APIView

from compute import services
from compute.api.serializers import CheckpointSerializer, InstanceActionSerializer
from compute.choices import ReclaimAction, VmState
from compute.models import VirtualMachine
from controlplane.errors import NotFound

HEADER = "X-Kumo-Metadata-Token"


class MetadataTokenAuthentication(authentication.BaseAuthentication):
    """``request.auth`` is the VM whose token the request carries; no user."""

    def authenticate(self, request):
        token = request.headers.get(HEADER, "")
        if not token:
            return None
        vm = (
            VirtualMachine.objects.select_related("project")
            .filter(metadata_token=token)
            .exclude(state=VmState.DELETED)
            .first()
        )
        if vm is None or not hmac.compare_digest(vm.metadata_token, token):
            raise exceptions.AuthenticationFailed("unknown metadata token")
        from django.contrib.auth.models import AnonymousUser

        return AnonymousUser(), vm

    def authenticate_header(self, request):
        return "KumoMetadataToken"


class MetadataTokenScheme(OpenApiAuthenticationExtension):
    target_class = MetadataTokenAuthentication
    name = "metadataToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": HEADER}


class HasMetadataToken(permissions.BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.auth, VirtualMachine)


class _MetadataView(APIView):
    authentication_classes = [MetadataTokenAuthentication]
    permission_classes = [HasMetadataToken]
    throttle_classes = []


def instance_action(vm: VirtualMachine) -> dict | None:
    """What is scheduled for ``vm``'s guest, AWS-style, or ``None``."""
    if vm.state == VmState.EVICTING and vm.eviction_deadline is not None:
        return {"action": "stop", "time": vm.eviction_deadline}
    if vm.reclaim_action and vm.reclaim_at is not None:
        action = "terminate" if vm.reclaim_action == ReclaimAction.DELETE else "stop"
        return {"action": action, "time": vm.reclaim_at}
    return None


class SpotInstanceActionView(_MetadataView):
    @extend_schema(
        operation_id="metadata_spot_instance_action",
        responses={
            200: InstanceActionSerializer,
            401: OpenApiResponse(description="no or unknown metadata token"),
            404: OpenApiResponse(description="nothing is scheduled for this VM"),
        },
    )
    def get(self, request):
        """The action about to be taken on this VM and its time; 404 when none."""
        action = instance_action(request.auth)
        if action is None:
            raise NotFound("no action is scheduled for this VM")
        return Response(InstanceActionSerializer(action).data)


class SpotAcknowledgeView(_MetadataView):
    @extend_schema(
        operation_id="metadata_spot_acknowledge",
        request=None,
        responses={
            200: InstanceActionSerializer,
            401: OpenApiResponse(description="no or unknown metadata token"),
            404: OpenApiResponse(description="this VM has no eviction notice"),
        },
    )
    def post(self, request):
        """The guest is ready to go: its eviction notice ends now."""
        vm = services.eviction_acknowledge(vm=request.auth)
        return Response(InstanceActionSerializer(instance_action(vm)).data)


class SpotCheckpointView(_MetadataView):
    @extend_schema(
        operation_id="metadata_spot_checkpoint",
        request=None,
        responses={
            200: CheckpointSerializer,
            401: OpenApiResponse(description="no or unknown metadata token"),
            409: OpenApiResponse(description="this VM is not running"),
        },
    )
    def post(self, request):
        """The guest saved its work: an eviction would lose only what it does from now on."""
        vm = services.checkpoint_report(vm=request.auth)
        vm.refresh_from_db(fields=["checkpoint_interval_s"])  # the report's UPDATE set it
        return Response(CheckpointSerializer(vm).data)
