from django.contrib import admin

from controlplane.models import AuditEvent, Event, IdempotencyKey, Operation, Webhook


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records that nobody edits: the trail and the work log are written by services."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = [
        "at",
        "actor_name",
        "source",
        "action",
        "object_repr",
        "project_slug",
        "outcome",
        "ip_address",
    ]
    list_filter = ["source", "outcome", "action", "at"]
    search_fields = [
        "actor_name",
        "action",
        "object_repr",
        "object_id",
        "project_slug",
        "ip_address",
        "request_id",
    ]
    date_hierarchy = "at"


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "target_type", "target_id", "state", "created_at", "finished_at"]
    list_filter = ["state", "kind"]
    search_fields = ["id", "target_id", "error_code"]
    date_hierarchy = "created_at"


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = ["key", "user", "status_code", "created_at"]
    search_fields = ["key", "user__username"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "project", "kind", "message"]
    list_filter = ["kind"]
    search_fields = ["project__slug", "kind", "message", "object_id"]
    list_select_related = ["project"]


@admin.register(Webhook)
class WebhookAdmin(ReadOnlyAdmin):
    list_display = ["project", "url", "active", "last_delivery_at", "last_status"]
    search_fields = ["project__slug", "url"]
    list_select_related = ["project"]
    exclude = ["secret"]
