"""The operators' console for people and projects. Every save goes through a service, so the
admin is audited and checked like the API."""

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from controlplane import audit
from controlplane.errors import KumoError
from tenants import services
from tenants.models import ApiToken, ExternalIdentity, Membership, Project, Quota, SSHKey, User


class ServiceAdmin(admin.ModelAdmin):
    """Turns a service's refusal into an error message instead of a 500."""

    def _run(self, request, fn, **kwargs):
        try:
            return fn(**kwargs)
        except KumoError as e:
            self.message_user(request, e.message, level=messages.ERROR)
            return None


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """Django's user admin; its changes are audited through the admin's own log hooks."""

    list_filter = [*DjangoUserAdmin.list_filter]

    def log_addition(self, request, obj, message):
        audit.record("user.create", obj)
        return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        audit.record("user.update", obj, detail={"change": str(message)[:500]})
        return super().log_change(request, obj, message)

    def log_deletions(self, request, queryset):
        for obj in queryset:
            audit.record("user.delete", obj)
        return super().log_deletions(request, queryset)


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(admin.ModelAdmin):
    list_display = ["user", "issuer", "subject", "created_at"]
    search_fields = ["user__username", "issuer", "subject"]
    list_filter = ["issuer"]


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ["user", "role", "created_at"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(ServiceAdmin):
    list_display = ["slug", "name", "owner", "status", "valid_from", "valid_until", "created_at"]
    list_filter = ["status", "valid_until"]
    search_fields = ["slug", "name", "owner__username", "owner__email"]
    inlines = [MembershipInline]
    actions = ["suspend", "reactivate"]

    def get_readonly_fields(self, request, obj=None):
        return (
            ["slug", "owner", "created_at", "updated_at"] if obj else ["created_at", "updated_at"]
        )

    def save_model(self, request, obj, form, change):
        if not change:
            created = self._run(
                request,
                services.project_create,
                slug=obj.slug,
                name=obj.name,
                owner=obj.owner,
                description=obj.description,
                valid_from=obj.valid_from,
                valid_until=obj.valid_until,
            )
            if created is not None:
                obj.pk = created.pk
            return
        fields = {f: getattr(obj, f) for f in ("name", "description", "valid_from", "valid_until")}
        self._run(request, services.project_update, project=obj, **fields)
        if "status" in form.changed_data:
            self._run(
                request, services.project_set_status, project=obj, status=obj.status, reason="admin"
            )

    def delete_model(self, request, obj):
        self._run(request, services.project_delete, project=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)

    @admin.action(description="Suspend the selected projects")
    def suspend(self, request, queryset):
        for project in queryset:
            services.project_set_status(project=project, status="suspended", reason="admin")

    @admin.action(description="Reactivate the selected projects")
    def reactivate(self, request, queryset):
        for project in queryset:
            services.project_set_status(project=project, status="active", reason="admin")


@admin.register(Membership)
class MembershipAdmin(ServiceAdmin):
    list_display = ["project", "user", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["project__slug", "user__username", "user__email"]
    autocomplete_fields = ["project", "user"]

    def get_readonly_fields(self, request, obj=None):
        return ["project", "user", "created_at"] if obj else ["created_at"]

    def save_model(self, request, obj, form, change):
        if change:
            self._run(request, services.membership_update, membership=obj, role=obj.role)
        else:
            created = self._run(
                request, services.membership_add, project=obj.project, user=obj.user, role=obj.role
            )
            if created is not None:
                obj.pk = created.pk

    def delete_model(self, request, obj):
        self._run(request, services.membership_remove, membership=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(Quota)
class QuotaAdmin(ServiceAdmin):
    list_display = ["project", *Quota.RESOURCES]
    search_fields = ["project__slug"]
    readonly_fields = ["project", "updated_at"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        limits = {name: getattr(obj, name) for name in Quota.RESOURCES}
        self._run(request, services.quota_set, project=obj.project, **limits)


@admin.register(SSHKey)
class SSHKeyAdmin(ServiceAdmin):
    list_display = ["user", "name", "key_type", "bits", "fingerprint", "created_at"]
    list_filter = ["key_type"]
    search_fields = ["user__username", "name", "fingerprint", "comment"]
    readonly_fields = [
        "user",
        "name",
        "public_key",
        "key_type",
        "bits",
        "fingerprint",
        "comment",
        "created_at",
    ]

    def has_add_permission(self, request):
        return False

    def delete_model(self, request, obj):
        services.sshkey_delete(key=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            services.sshkey_delete(key=obj)


@admin.register(ApiToken)
class ApiTokenAdmin(ServiceAdmin):
    list_display = ["name", "user", "prefix", "project", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at", "expires_at"]
    search_fields = ["name", "prefix", "user__username", "project__slug"]
    readonly_fields = [
        "user",
        "name",
        "prefix",
        "project",
        "expires_at",
        "last_used_at",
        "revoked_at",
        "created_at",
    ]
    exclude = ["digest"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.token_revoke(token=token)
