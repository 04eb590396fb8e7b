from django.contrib import admin

from compute import services
from compute.choices import HostState
from compute.models import (
    CapacityGuarantee,
    Device,
    Host,
    Image,
    PlacementGroup,
    Template,
    VirtualMachine,
)
from controlplane.admin import ReadOnlyAdmin
from controlplane.errors import KumoError


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


@admin.register(Device)
class DeviceAdmin(ReadOnlyAdmin):
    list_display = ["host", "pci_address", "kind", "model", "numa_node", "present", "vm"]
    list_filter = ["kind", "model", "present", "numa_node"]
    search_fields = ["host__name", "pci_address", "vm__name"]
    list_select_related = ["host", "vm"]


@admin.register(VirtualMachine)
class VirtualMachineAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "project",
        "state",
        "task_state",
        "power_state",
        "host",
        "gpus",
        "priority",
        "eviction_deadline",
        "reclaim_action",
        "reclaim_at",
        "created_at",
    ]
    list_filter = ["state", "priority", "power_state", "reclaim_action", "reclaim_reason"]
    search_fields = ["name", "id", "project__slug", "host__name"]
    list_select_related = ["project", "host"]
    actions = ["stop", "delete_vms"]

    def _run(self, request, queryset, service):
        for vm in queryset.select_related("project"):
            try:
                service(vm=vm, actor=request.user)
            except KumoError as e:
                self.message_user(request, f"{vm.name}: {e.message}", level="error")

    @admin.action(description="Stop")
    def stop(self, request, queryset):
        self._run(request, queryset, services.vm_stop)

    @admin.action(description="Delete")
    def delete_vms(self, request, queryset):
        self._run(request, queryset, services.vm_delete)


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "vcpus",
        "memory_gib",
        "gpus",
        "gpu_model",
        "disk_gib",
        "spot_allowed",
        "eviction_notice_s",
        "active",
    ]
    list_filter = ["gpus", "active", "spot_allowed"]

    def get_readonly_fields(self, request, obj=None):
        # Sizes are fixed once created: VMs copied them.
        fixed = ["name", "vcpus", "memory_gib", "gpus", "gpu_model", "disk_gib"]
        return [*fixed, "eviction_notice_s", "evict_action"] if obj else []

    def save_model(self, request, obj, form, change):
        if change:
            services.template_update(template=obj, active=obj.active, description=obj.description)
        else:
            created = services.template_create(
                **{
                    f: form.cleaned_data[f]
                    for f in (
                        "name",
                        "vcpus",
                        "memory_gib",
                        "gpus",
                        "gpu_model",
                        "disk_gib",
                        "spot_allowed",
                        "description",
                        "eviction_notice_s",
                        "evict_action",
                    )
                }
            )
            obj.pk = created.pk


@admin.register(Image)
class ImageAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "os_distro",
        "os_version",
        "format",
        "visibility",
        "project",
        "state",
        "size_bytes",
    ]
    list_filter = ["visibility", "format", "state"]
    search_fields = ["name", "location"]


@admin.register(PlacementGroup)
class PlacementGroupAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "policy", "created_at"]
    list_filter = ["policy"]


@admin.register(CapacityGuarantee)
class CapacityGuaranteeAdmin(admin.ModelAdmin):
    """Guaranteed minimums; saved through ``compute.services.guarantee_set`` (audited)."""

    list_display = ["project", "min_gpus", "updated_at"]
    search_fields = ["project__slug"]
    list_select_related = ["project"]

    def save_model(self, request, obj, form, change):
        saved = services.guarantee_set(
            project=obj.project,
            min_gpus=obj.min_gpus,
            gpu_model=obj.gpu_model,
            min_vcpus=obj.min_vcpus,
        )
        obj.pk = saved.pk
