from rest_framework import mixins

from controlplane.api.serializers import AuditEventSerializer, OperationSerializer
from controlplane.api.viewsets import OperatorViewSet, ReadOnlyProjectViewSet
from controlplane.filtersets import AuditEventFilterSet, OperationFilterSet
from controlplane.models import AuditEvent, Operation


class ProjectAuditEventViewSet(ReadOnlyProjectViewSet):
    """The project's audit trail: every change and refused change, newest first."""

    model = AuditEvent
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilterSet
    ordering_fields = ["at"]


class ProjectOperationViewSet(ReadOnlyProjectViewSet):
    """Asynchronous work in the project; a 202 answer points at one of these."""

    model = Operation
    serializer_class = OperationSerializer
    filterset_class = OperationFilterSet
    ordering_fields = ["created_at"]
    lookup_value_regex = r"[0-9a-fA-F-]{36}"

    def get_queryset(self):
        return super().get_queryset().select_related("project")


class OperatorAuditEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """The whole audit trail, for operators."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilterSet
    ordering_fields = ["at"]


class OperatorOperationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """Every operation, for operators (host operations have no project)."""

    queryset = Operation.objects.select_related("project")
    serializer_class = OperationSerializer
    filterset_class = OperationFilterSet
    ordering_fields = ["created_at"]
    lookup_value_regex = r"[0-9a-fA-F-]{36}"
