from rest_framework import serializers
from rest_framework.reverse import reverse

from controlplane.api import fields
from controlplane.models import AuditEvent, Event, Operation, Webhook


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", read_only=True)
    project = serializers.CharField(source="project_slug", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "at",
            "actor",
            "source",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "project",
            "ip_address",
            "outcome",
            "detail",
            "request_id",
        ]
        read_only_fields = fields


class OperationSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = Operation
        fields = [
            "id",
            "url",
            "kind",
            "target_type",
            "target_id",
            "state",
            "created_at",
            "updated_at",
            "deadline_at",
            "finished_at",
            "result",
            "error_code",
            "error_message",
        ]
        read_only_fields = fields

    def get_url(self, operation) -> str:
        request = self.context.get("request")
        if operation.project_id is not None:
            return reverse(
                "api:project-operation-detail",
                kwargs={"project_slug": operation.project.slug, "pk": operation.pk},
                request=request,
            )
        return reverse("api:admin-operation-detail", kwargs={"pk": operation.pk}, request=request)


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = ["id", "kind", "message", "object_type", "object_id", "payload", "created_at"]
        read_only_fields = fields


class WebhookSerializer(serializers.ModelSerializer):
    class Meta:
        model = Webhook
        fields = ["id", "url", "kinds", "active", "created_at", "last_delivery_at", "last_status"]
        read_only_fields = ["id", "active", "created_at", "last_delivery_at", "last_status"]


class WebhookCreateSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=500, help_text="http(s) URL the events are POSTed to")
    kinds = serializers.ListField(
        child=fields.CharField(min_length=1, max_length=64),
        required=False,
        default=list,
        max_length=32,
        help_text="event kinds to send (empty: all)",
    )


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(read_only=True, help_text="shown once: sign-check with it")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]
