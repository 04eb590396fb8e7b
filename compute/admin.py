from django.contrib import admin

from compute import services
from compute.choices import HostState
from compute.models import Host


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "state",
        "state_reason",
        "rack",
        "zone",
        "agent_version",
        "last_heartbeat_at",
    ]
    list_filter = ["state", "rack", "zone"]
    search_fields = ["name", "rack", "zone", "libvirt_uri"]
    readonly_fields = [f.name for f in Host._meta.fields]
    actions = ["drain", "maintenance", "return_to_service", "ping"]

    def has_add_permission(self, request):
        return False  # hosts enroll through their agent's first heartbeat

    def _set_state(self, request, queryset, state):
        from controlplane.errors import KumoError

        for host in queryset:
            try:
                services.host_set_state(host=host, state=state, reason="admin console")
            except KumoError as e:
                self.message_user(request, e.message, level="error")

    @admin.action(description="Drain (take no new VMs)")
    def drain(self, request, queryset):
        self._set_state(request, queryset, HostState.DRAINING)

    @admin.action(description="Put into maintenance")
    def maintenance(self, request, queryset):
        self._set_state(request, queryset, HostState.MAINTENANCE)

    @admin.action(description="Return to service")
    def return_to_service(self, request, queryset):
        self._set_state(request, queryset, HostState.UP)

    @admin.action(description="Ping the agent")
    def ping(self, request, queryset):
        for host in queryset:
            operation = services.host_ping(host=host, actor=request.user)
            self.message_user(request, f"ping {host.name}: operation {operation.pk}")
