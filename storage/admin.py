"""The operators' console for storage: every storage object is on view, nothing is edited
by hand (writes go through ``storage.services``, like the API's). Operators can send every
share to its host again, which repairs drift and refreshes usage. List pages select their
related rows up front, so a page costs the same queries whatever its length."""

from django.contrib import admin, messages

from controlplane.admin import ReadOnlyAdmin
from storage import services
from storage.models import AccessKey, Bucket, Share, StorageUsage, Volume


@admin.register(Volume)
class VolumeAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "size_gib", "tier", "state", "vm", "device", "host"]
    list_filter = ["tier", "state"]
    search_fields = ["name", "project__slug", "id"]
    list_select_related = ["project", "vm", "host"]


@admin.register(Share)
class ShareAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "project",
        "tier",
        "backend",
        "quota_gib",
        "used_bytes",
        "project_number",
        "generation",
        "applied_generation",
        "last_error",
    ]
    list_filter = ["tier", "backend"]
    search_fields = ["name", "project__slug", "project_number"]
    list_select_related = ["project", "host"]
    actions = ["resync"]

    @admin.action(description="Send the selected shares to their hosts again")
    def resync(self, request, queryset):
        count = services.shares_sync(queryset.values_list("pk", flat=True))
        self.message_user(request, f"sent {count} shares", messages.SUCCESS)


@admin.register(Bucket)
class BucketAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "quota_gib", "used_bytes", "usage_at", "created_at"]
    search_fields = ["name", "project__slug"]
    list_select_related = ["project"]


@admin.register(AccessKey)
class AccessKeyAdmin(ReadOnlyAdmin):
    list_display = ["access_key_id", "project", "description", "created_by", "created_at"]
    search_fields = ["access_key_id", "project__slug"]
    list_select_related = ["project", "created_by"]


@admin.register(StorageUsage)
class StorageUsageAdmin(ReadOnlyAdmin):
    list_display = ["project", "kind", "object_id", "gib", "started_at", "ended_at"]
    list_filter = ["kind"]
    search_fields = ["object_id", "project__slug"]
    list_select_related = ["project"]
