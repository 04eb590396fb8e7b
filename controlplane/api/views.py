from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.response import Response

from controlplane import services
from controlplane.api.serializers import (
    AuditEventSerializer,
    EventSerializer,
    OperationSerializer,
    WebhookCreatedSerializer,
    WebhookCreateSerializer,
    WebhookSerializer,
)
from controlplane.api.viewsets import (
    OperatorViewSet,
    ProjectScopedViewSet,
    ReadOnlyProjectViewSet,
)
from controlplane.filtersets import AuditEventFilterSet, EventFilterSet, OperationFilterSet
from controlplane.models import AuditEvent, Event, Operation, Webhook
from tenants.choices import Role


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


class ProjectEventViewSet(ReadOnlyProjectViewSet):
    """What happened to the project that it should know: eviction notices, budget alerts,
    reclamation steps; newest first."""

    model = Event
    serializer_class = EventSerializer
    filterset_class = EventFilterSet
    ordering_fields = ["created_at"]


class WebhookViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    ProjectScopedViewSet,
):
    """The project's webhooks. The signing secret is shown once, in the create answer."""

    model = Webhook
    serializer_class = WebhookSerializer
    write_role = Role.ADMIN
    audit_object_type = "controlplane.webhook"

    @extend_schema(request=WebhookCreateSerializer, responses={201: WebhookCreatedSerializer})
    def create(self, request, project_slug=None):
        data = WebhookCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        hook, secret = services.webhook_create(project=self.project, **data.validated_data)
        body = WebhookCreatedSerializer(hook).data
        body["secret"] = secret
        return Response(body, status=201)

    def perform_destroy(self, instance):
        services.webhook_delete(webhook=instance)
