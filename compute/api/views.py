from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.response import Response

from compute import services
from compute.api.serializers import HostSerializer, HostStateSerializer
from compute.filtersets import HostFilterSet
from compute.models import Host
from controlplane.api.serializers import OperationSerializer
from controlplane.api.viewsets import OperatorViewSet, accepted


class OperatorHostViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """The fleet, for operators: hosts, their agents' liveness, drain and maintenance."""

    queryset = Host.objects.all()
    serializer_class = HostSerializer
    filterset_class = HostFilterSet
    ordering_fields = ["name", "state", "last_heartbeat_at"]
    lookup_field = "name"
    audit_object_type = "compute.host"

    @extend_schema(request=HostStateSerializer, responses=HostSerializer)
    @action(detail=True, methods=["post"], url_path="state")
    def set_state(self, request, name=None):
        data = HostStateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        host = services.host_set_state(host=self.get_object(), **data.validated_data)
        return Response(HostSerializer(host).data)

    @extend_schema(request=None, responses={202: OperationSerializer})
    @action(detail=True, methods=["post"])
    def ping(self, request, name=None):
        operation = services.host_ping(host=self.get_object(), actor=request.user)
        return accepted(operation, OperationSerializer, request)
