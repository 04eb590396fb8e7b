from rest_framework import serializers
from rest_framework.reverse import reverse

from controlplane.models import AuditEvent, Operation


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
