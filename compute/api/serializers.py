from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers
from rest_framework.reverse import reverse

from compute.choices import (
    HostState,
    ImageFormat,
    PlacementPolicy,
    Priority,
    ReclaimAction,
    ReclaimReason,
)
from compute.models import (
    CapacityGuarantee,
    Device,
    Host,
    Image,
    Lease,
    PlacementGroup,
    Template,
    VirtualMachine,
    hostname_validator,
)
from controlplane.api import fields

USER_DATA_MAX_BYTES = 64 * 1024  # what cloud-init's NoCloud seed comfortably carries


class ConsoleLogQuerySerializer(serializers.Serializer):
    bytes = serializers.IntegerField(
        min_value=1, max_value=65536, default=65536, help_text="at most this many bytes"
    )
    lines = serializers.IntegerField(
        min_value=1, max_value=100000, required=False, help_text="only the last lines"
    )


class ConsoleLogSerializer(serializers.Serializer):
    output = serializers.CharField(help_text="what the guest printed, UTF-8 (bad bytes replaced)")
    bytes = serializers.IntegerField(help_text="bytes read from the log")


class ConsoleTicketSerializer(serializers.Serializer):
    url = serializers.CharField(
        help_text="the console proxy's websocket URL for this VM, the token in its query"
    )
    token = serializers.CharField(help_text="connects once, to this VM, for this user")
    expires_at = serializers.DateTimeField(help_text="connect before this (the session may last)")


class DeviceSerializer(serializers.ModelSerializer):
    host = serializers.SlugRelatedField(slug_field="name", read_only=True)
    vm = serializers.UUIDField(source="vm_id", read_only=True, allow_null=True)

    class Meta:
        model = Device
        fields = [
            "id",
            "host",
            "pci_address",
            "kind",
            "model",
            "numa_node",
            "iommu_group",
            "physical_function",
            "present",
            "vm",
        ]
        read_only_fields = fields


class HostSerializer(serializers.ModelSerializer):
    gpus = serializers.IntegerField(read_only=True, help_text="GPUs present")
    gpus_free = serializers.IntegerField(read_only=True, help_text="GPUs present and unallocated")

    class Meta:
        model = Host
        fields = [
            "name",
            "state",
            "state_reason",
            "libvirt_uri",
            "hypervisor",
            "guest_accel",
            "agent_version",
            "agent_started_at",
            "capabilities",
            "last_heartbeat_at",
            "rack",
            "zone",
            "vcpus",
            "memory_mib",
            "numa_cells",
            "cpu_allocation_ratio",
            "ram_allocation_ratio",
            "vcpus_used",
            "memory_mib_used",
            "gpus",
            "gpus_free",
            "inventory_reported_at",
            "guests_reported_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class HostUpdateSerializer(serializers.Serializer):
    rack = fields.CharField(max_length=64, required=False, allow_blank=True)
    zone = fields.CharField(max_length=64, required=False, allow_blank=True)
    cpu_allocation_ratio = serializers.FloatField(min_value=0.1, max_value=32.0, required=False)
    ram_allocation_ratio = serializers.FloatField(min_value=0.1, max_value=4.0, required=False)


class HostStateSerializer(serializers.Serializer):
    state = serializers.ChoiceField(
        choices=[HostState.UP, HostState.DRAINING, HostState.MAINTENANCE]
    )
    reason = fields.CharField(max_length=200, required=False, allow_blank=True, default="")


class TemplateSerializer(fields.ModelSerializer):
    gpus = serializers.ChoiceField(choices=[0, 1, 2, 4, 8], default=0)

    class Meta:
        model = Template
        fields = [
            "name",
            "description",
            "vcpus",
            "memory_gib",
            "gpus",
            "gpu_model",
            "disk_gib",
            "spot_allowed",
            "eviction_notice_s",
            "evict_action",
            "active",
            "created_at",
        ]
        read_only_fields = ["active", "created_at"]
        extra_kwargs = {"name": {"validators": []}}  # taken: the service's 409


class TemplateUpdateSerializer(serializers.Serializer):
    active = fields.BooleanField(required=False)
    description = fields.CharField(max_length=200, required=False, allow_blank=True)


class ImageSerializer(fields.ModelSerializer):
    """An image. ``checksum`` (``sha256:<hex>``) and ``size_bytes`` are what the store
    computed from the uploaded bytes (while ``uploading``: the checksum the upload must
    match, if one was given); ``location`` is its key in the image store, or the path of
    an image pre-staged on every host."""

    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Image
        fields = [
            "id",
            "name",
            "description",
            "os_distro",
            "os_version",
            "format",
            "login_user",
            "location",
            "checksum",
            "size_bytes",
            "min_disk_gib",
            "min_memory_gib",
            "visibility",
            "project",
            "state",
            "state_reason",
            "created_at",
        ]
        read_only_fields = fields


class ImageCreateSerializer(serializers.Serializer):
    """A new image's record; its bytes follow with ``PUT …/images/{id}/file``."""

    name = fields.CharField(max_length=100)
    description = fields.CharField(max_length=200, required=False, default="", allow_blank=True)
    os_distro = fields.CharField(max_length=32, help_text="e.g. debian")
    os_version = fields.CharField(max_length=32, required=False, default="", allow_blank=True)
    format = serializers.ChoiceField(choices=ImageFormat.choices)
    login_user = serializers.RegexField(
        r"^([a-z_][a-z0-9_-]{0,31})?$",  # blank: none (the schema's default must match)
        required=False,
        default="",
        allow_blank=True,
        help_text="the user a guest of this image is logged into, e.g. debian",
    )
    min_disk_gib = serializers.IntegerField(min_value=0, max_value=65536, required=False, default=0)
    min_memory_gib = serializers.IntegerField(
        min_value=0, max_value=65536, required=False, default=0
    )
    checksum = serializers.RegexField(
        r"^(sha256:[0-9a-f]{64})?$",
        required=False,
        default="",
        allow_blank=True,
        help_text="if given, the upload must have this SHA-256",
    )


class PlacementGroupSerializer(fields.ModelSerializer):
    policy = serializers.ChoiceField(choices=PlacementPolicy.choices)

    class Meta:
        model = PlacementGroup
        fields = ["id", "name", "policy", "created_at"]
        read_only_fields = ["created_at"]
        validators = []  # (project, name) taken: the service's 409


class VirtualMachineSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    template = serializers.SlugRelatedField(slug_field="name", read_only=True)
    image = serializers.PrimaryKeyRelatedField(read_only=True)
    placement_group = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    lease = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    host = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    gpu_addresses = serializers.SerializerMethodField()
    nics = serializers.SerializerMethodField()

    class Meta:
        model = VirtualMachine
        fields = [
            "id",
            "url",
            "name",
            "template",
            "image",
            "priority",
            "placement_group",
            "lease",
            "vcpus",
            "memory_mib",
            "gpus",
            "gpu_model",
            "disk_gib",
            "state",
            "task_state",
            "power_state",
            "state_reason",
            "generation",
            "host",
            "numa_cell",
            "gpu_addresses",
            "nics",
            "created_at",
            "updated_at",
            "launched_at",
            "running_since",
            "checkpointed_at",
            "checkpoint_interval_s",
            "deleted_at",
            "eviction_notice_at",
            "eviction_deadline",
            "eviction_acknowledged_at",
            "evicted_at",
            "active_at",
            "reclaim_action",
            "reclaim_reason",
            "reclaim_at",
        ]
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "port": {"type": "string", "format": "uuid"},
                    "network": {"type": "string"},
                    "mac": {"type": "string"},
                    "fixed_ips": {"type": "array", "items": {"type": "string"}},
                },
            },
        }
    )
    def get_nics(self, vm) -> list[dict]:
        """The VM's ports in NIC order (prefetched by the views: no query per VM)."""
        return [
            {
                "port": str(port.pk),
                "network": port.network.name,
                "mac": port.mac,
                "fixed_ips": [ip.address for ip in port.fixed_ips.all()],
            }
            for port in sorted(vm.ports.all(), key=lambda p: p.device_index)
        ]

    def get_url(self, vm) -> str:
        return reverse(
            "api:project-vm-detail",
            kwargs={"project_slug": vm.project.slug, "pk": vm.pk},
            request=self.context.get("request"),
        )

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_gpu_addresses(self, vm) -> list[str]:
        """The host PCI addresses of the VM's GPUs (for support and NCCL debugging)."""
        return sorted(d.pci_address for d in vm.devices.all())


class LeaseSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = Lease
        fields = [
            "id", "project", "name", "gpu_model", "gpus", "hosts", "starts_at", "ends_at",
            "lend_idle", "state", "state_reason", "created_by", "created_at", "ended_at",
        ]  # fmt: skip
        read_only_fields = fields


class LeaseCreateSerializer(serializers.Serializer):
    name = fields.CharField(max_length=63, validators=[hostname_validator])
    gpus = serializers.IntegerField(
        min_value=1, max_value=4096, required=False, help_text="GPUs, on any hosts"
    )
    hosts = serializers.IntegerField(
        min_value=1, max_value=512, required=False,
        help_text="whole hosts instead of GPUs: every GPU of each",
    )  # fmt: skip
    gpu_model = fields.CharField(
        max_length=64, required=False, allow_blank=True, default="",
        help_text="empty: the fleet's one GPU model",
    )  # fmt: skip
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    lend_idle = serializers.BooleanField(
        default=True,
        help_text="while it is active, spot VMs may run on the GPUs its VMs leave idle; a "
        "VM of the lease then waits for their eviction notice (at most one spot notice)",
    )


class LeaseUpdateSerializer(serializers.Serializer):
    lend_idle = serializers.BooleanField(
        required=False,
        help_text="lend its idle GPUs to spot VMs while it is active; false gives the spot "
        "VMs borrowing them their eviction notice now",
    )
    starts_at = serializers.DateTimeField(
        required=False,
        help_text="start it then instead, while it holds no GPUs yet (409 lease_started "
        "after): admitted again over its new period (409 with the earliest that fits); its "
        "end stays unless ends_at moves it too",
    )
    ends_at = serializers.DateTimeField(
        required=False,
        help_text="end it then instead (in the future): later is admitted again for the time "
        "it adds (409 with details.latest_ends_at when the fleet cannot hold it); earlier "
        "gives the time back",
    )
    gpus = serializers.IntegerField(
        min_value=1,
        max_value=4096,
        required=False,
        help_text="hold this many GPUs from now on (a lease of GPUs): more are admitted over "
        "what is left of it and held at once (409 naming the most that fit); fewer let go "
        "of GPUs its VMs do not use (409 when they use more)",
    )


class CapacityGuaranteeSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = CapacityGuarantee
        fields = ["project", "min_gpus", "gpu_model", "min_vcpus", "updated_at"]
        read_only_fields = ["project", "updated_at"]
        extra_kwargs = {
            "min_gpus": {"max_value": 2**31 - 1, "required": True},
            "min_vcpus": {"max_value": 2**31 - 1, "required": False},
            "gpu_model": {"required": False},
        }


class ReclamationThresholdsSerializer(serializers.Serializer):
    idle_after_s = serializers.IntegerField(help_text="0: idle VMs are never stopped")
    idle_cpu_percent = serializers.FloatField()
    idle_warning_s = serializers.IntegerField()
    expired_stop_notice_s = serializers.IntegerField()
    expired_delete_grace_s = serializers.IntegerField()
    spot_stop_grace_s = serializers.FloatField()
    spot_eviction_cost_s = serializers.FloatField(
        help_text="what preemption counts per evicted GPU beyond the work it loses"
    )
    spot_notice_stretch_s = serializers.FloatField(
        help_text="how much longer than its template's an eviction notice may run, to "
        "wait for a save its guest is expected to make just after it"
    )


class ReclamationStepSerializer(serializers.Serializer):
    vm = serializers.UUIDField()
    name = serializers.CharField()
    action = serializers.ChoiceField(choices=ReclaimAction.choices)
    reason = serializers.ChoiceField(choices=ReclaimReason.choices)
    at = serializers.DateTimeField()


@extend_schema_serializer(many=False)  # answered by a list action (one report)
class ReclamationReportSerializer(serializers.Serializer):
    """The project's guaranteed minimum, reclamation's thresholds and its scheduled steps."""

    project_status = serializers.CharField()
    valid_until = serializers.DateField(allow_null=True)
    min_gpus = serializers.IntegerField()
    thresholds = ReclamationThresholdsSerializer()
    scheduled = ReclamationStepSerializer(many=True)


class CheckpointSerializer(serializers.Serializer):
    """A guest's checkpoint as Kumo recorded it."""

    checkpointed_at = serializers.DateTimeField(read_only=True)
    checkpoint_interval_s = serializers.FloatField(
        read_only=True,
        allow_null=True,
        help_text="seconds since the save before (or the start): Kumo expects the next save "
        "one interval after this one",
    )


class InstanceActionSerializer(serializers.Serializer):
    """What is about to happen to the guest (AWS's spot ``instance-action``)."""

    action = serializers.ChoiceField(choices=["stop", "terminate"])
    time = serializers.DateTimeField()


class NicSerializer(serializers.Serializer):
    """One NIC of a new VM: a port on the project's network ``network`` (by name)."""

    network = fields.CharField(max_length=63, help_text="a network's name")
    fixed_ip = serializers.IPAddressField(protocol="IPv4", required=False)
    security_groups = serializers.ListField(
        child=fields.CharField(max_length=63),
        required=False,
        max_length=16,
        help_text="names; default: the project's default group",
    )


class VirtualMachineAcceptedSerializer(VirtualMachineSerializer):
    """A VM create's 202 answer: the VM as it is now, and where to follow its creation."""

    operation = serializers.URLField(
        read_only=True, help_text="the URL of the vm.create operation; poll it until it ends"
    )

    class Meta(VirtualMachineSerializer.Meta):
        fields = [*VirtualMachineSerializer.Meta.fields, "operation"]
        read_only_fields = fields


class VirtualMachineCreateSerializer(serializers.Serializer):
    name = fields.CharField(max_length=63, validators=[hostname_validator])
    template = fields.CharField(max_length=63, help_text="a template's name")
    image = serializers.IntegerField(min_value=1, help_text="an image's id")
    ssh_keys = serializers.ListField(
        child=fields.CharField(max_length=100),
        required=False,
        default=list,
        max_length=32,
        help_text="names of your SSH keys to install for the default user",
    )
    user_data = fields.CharField(
        required=False, allow_blank=True, default="", trim_whitespace=False
    )
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.ON_DEMAND)
    placement_group = fields.CharField(max_length=63, required=False, allow_null=True)
    lease = fields.CharField(
        max_length=63, required=False, allow_null=True,
        help_text="a lease of the project (by name) to run in: placed on its GPUs",
    )  # fmt: skip
    wait_for_capacity = fields.BooleanField(
        default=True,
        help_text="when nothing fits now: true keeps the VM pending until room appears; "
        "false answers 409 and creates nothing",
    )
    nics = serializers.ListField(
        child=NicSerializer(), required=False, default=list, max_length=8, help_text="at most 8"
    )

    def validate_user_data(self, value):
        if len(value.encode()) > USER_DATA_MAX_BYTES:
            raise serializers.ValidationError(f"at most {USER_DATA_MAX_BYTES} bytes")
        return value
