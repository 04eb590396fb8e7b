from rest_framework import serializers

from controlplane.api import fields
from controlplane.validators import hostname_validator
from network.choices import (
    ConnectionKind,
    Direction,
    ForwardProtocol,
    NetworkKind,
    Protocol,
)
from network.models import (
    ExternalConnection,
    GlobalIp,
    GlobalIpPool,
    HostNetwork,
    Network,
    Port,
    PortForward,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)

NAME = {"max_length": 63}


class NetworkSerializer(serializers.ModelSerializer):
    class Meta:
        model = Network
        fields = [
            "id",
            "name",
            "description",
            "kind",
            "vni",
            "mtu",
            "external_access",
            "rdma_dscp",
            "rdma_ecn",
            "rdma_pfc_priority",
            "created_at",
        ]
        read_only_fields = fields


class NetworkCreateSerializer(serializers.Serializer):
    name = fields.CharField(validators=[hostname_validator], **NAME)
    description = fields.CharField(max_length=200, required=False, default="", allow_blank=True)
    kind = serializers.ChoiceField(choices=NetworkKind.choices, default=NetworkKind.OVERLAY)
    external_access = fields.BooleanField(
        default=False, help_text="the project router joins it and source-NATs to the outside"
    )
    cidr = fields.CharField(
        max_length=18, required=False, default="", allow_blank=True, help_text="a first subnet"
    )
    rdma_dscp = serializers.IntegerField(min_value=0, max_value=63, required=False)
    rdma_ecn = fields.BooleanField(required=False)
    rdma_pfc_priority = serializers.IntegerField(min_value=0, max_value=7, required=False)


class NetworkUpdateSerializer(serializers.Serializer):
    description = fields.CharField(max_length=200, required=False, allow_blank=True)
    external_access = fields.BooleanField(required=False)


class SubnetSerializer(serializers.ModelSerializer):
    network = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Subnet
        fields = [
            "id",
            "network",
            "name",
            "cidr",
            "gateway_ip",
            "pool_start",
            "pool_end",
            "dns_servers",
            "created_at",
        ]
        read_only_fields = fields


class SubnetCreateSerializer(serializers.Serializer):
    network = fields.CharField(help_text="the network's name", **NAME)
    name = fields.CharField(required=False, default="", allow_blank=True, **NAME)
    cidr = fields.CharField(max_length=18)
    gateway_ip = serializers.IPAddressField(
        protocol="IPv4", required=False, allow_null=True, help_text="default: first address"
    )
    pool_start = serializers.IPAddressField(protocol="IPv4", required=False)
    pool_end = serializers.IPAddressField(protocol="IPv4", required=False)
    dns_servers = serializers.ListField(
        child=serializers.IPAddressField(protocol="IPv4"), required=False, max_length=4
    )


class SubnetUpdateSerializer(serializers.Serializer):
    dns_servers = serializers.ListField(
        child=serializers.IPAddressField(protocol="IPv4"),
        max_length=4,
        help_text="the servers its guests are told; [] for the network's own resolver",
    )


class PortSerializer(serializers.ModelSerializer):
    network = serializers.SlugRelatedField(slug_field="name", read_only=True)
    vm = serializers.UUIDField(source="vm_id", read_only=True, allow_null=True)
    host = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    fixed_ips = serializers.SerializerMethodField()
    security_groups = serializers.SerializerMethodField()
    global_ip = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()

    class Meta:
        model = Port
        fields = [
            "id",
            "name",
            "network",
            "mac",
            "fixed_ips",
            "vm",
            "device_index",
            "host",
            "binding",
            "port_security",
            "security_groups",
            "global_ip",
            "status",
            "created_at",
        ]
        read_only_fields = fields

    def get_fixed_ips(self, port) -> list[str]:
        return [ip.address for ip in port.fixed_ips.all()]

    def get_security_groups(self, port) -> list[str]:
        return sorted(g.name for g in port.security_groups.all())

    def get_global_ip(self, port) -> str | None:
        gip = getattr(port, "global_ip", None)
        return gip.address if gip else None

    def get_status(self, port) -> str:
        return self.context.get("statuses", {}).get(port.pk, "down")


class PortCreateSerializer(serializers.Serializer):
    network = fields.CharField(help_text="the network's name", **NAME)
    name = fields.CharField(required=False, default="", allow_blank=True, **NAME)
    fixed_ip = serializers.IPAddressField(protocol="IPv4", required=False)
    security_groups = serializers.ListField(
        child=fields.CharField(**NAME), required=False, max_length=16
    )
    port_security = fields.BooleanField(default=True)


class PortUpdateSerializer(serializers.Serializer):
    name = fields.CharField(required=False, allow_blank=True, **NAME)
    security_groups = serializers.ListField(
        child=fields.CharField(**NAME), required=False, max_length=16
    )
    port_security = fields.BooleanField(required=False)


class RuleSerializer(serializers.ModelSerializer):
    group = serializers.SlugRelatedField(slug_field="name", read_only=True)
    remote_group = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = SecurityGroupRule
        fields = [
            "id",
            "group",
            "direction",
            "protocol",
            "port_min",
            "port_max",
            "remote_cidr",
            "remote_group",
            "description",
            "created_at",
        ]
        read_only_fields = fields


class RuleCreateSerializer(serializers.Serializer):
    group = fields.CharField(help_text="the security group's name", **NAME)
    direction = serializers.ChoiceField(choices=Direction.choices)
    protocol = serializers.ChoiceField(choices=Protocol.choices, default=Protocol.ANY)
    port_min = serializers.IntegerField(min_value=1, max_value=65535, required=False)
    port_max = serializers.IntegerField(min_value=1, max_value=65535, required=False)
    remote_cidr = fields.CharField(max_length=18, required=False, default="", allow_blank=True)
    remote_group = fields.CharField(required=False, help_text="a security group's name", **NAME)
    description = fields.CharField(max_length=200, required=False, default="", allow_blank=True)


class SecurityGroupSerializer(serializers.ModelSerializer):
    rules = RuleSerializer(many=True, read_only=True)

    class Meta:
        model = SecurityGroup
        fields = ["id", "name", "description", "rules", "created_at"]
        read_only_fields = ["id", "rules", "created_at"]
        # the name's rule is in the schema (pattern); a taken name is the service's 409
        extra_kwargs = {"name": {"validators": [hostname_validator]}}


class GlobalIpSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    port = serializers.UUIDField(source="port_id", read_only=True, allow_null=True)

    class Meta:
        model = GlobalIp
        fields = ["id", "address", "pool", "port", "router", "description", "created_at"]
        read_only_fields = fields


class GlobalIpCreateSerializer(serializers.Serializer):
    description = fields.CharField(max_length=200, required=False, default="", allow_blank=True)


class GlobalIpAssociateSerializer(serializers.Serializer):
    port = serializers.UUIDField(allow_null=True, help_text="a port's id; null dissociates")


class PortForwardSerializer(serializers.ModelSerializer):
    global_ip = serializers.SlugRelatedField(slug_field="address", read_only=True)
    port = serializers.UUIDField(source="port_id", read_only=True)

    class Meta:
        model = PortForward
        fields = [
            "id",
            "global_ip",
            "protocol",
            "external_port",
            "port",
            "internal_port",
            "description",
            "created_at",
        ]
        read_only_fields = fields


class PortForwardCreateSerializer(serializers.Serializer):
    global_ip = serializers.IPAddressField(protocol="IPv4", help_text="one of your global IPs")
    protocol = serializers.ChoiceField(choices=ForwardProtocol.choices)
    external_port = serializers.IntegerField(min_value=1, max_value=65535)
    port = serializers.UUIDField(help_text="the port traffic goes to")
    internal_port = serializers.IntegerField(min_value=1, max_value=65535)
    description = fields.CharField(max_length=200, required=False, default="", allow_blank=True)


class ExternalConnectionSerializer(serializers.ModelSerializer):
    network = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = ExternalConnection
        fields = [
            "id",
            "project",
            "name",
            "kind",
            "network",
            "vlan_id",
            "destination_cidr",
            "next_hop",
            "remote",
            "state",
            "review_note",
            "reviewed_at",
            "created_at",
        ]
        read_only_fields = fields


class ExternalConnectionCreateSerializer(serializers.Serializer):
    name = fields.CharField(validators=[hostname_validator], **NAME)
    kind = serializers.ChoiceField(choices=ConnectionKind.choices)
    network = fields.CharField(required=False, help_text="L2VPN: the network's name", **NAME)
    vlan_id = serializers.IntegerField(min_value=1, max_value=4094, required=False)
    destination_cidr = fields.CharField(max_length=18, required=False)
    next_hop = serializers.IPAddressField(protocol="IPv4", required=False)
    remote = fields.CharField(max_length=200, required=False, default="", allow_blank=True)


class ReviewSerializer(serializers.Serializer):
    note = fields.CharField(max_length=500, required=False, default="", allow_blank=True)


class GlobalIpPoolSerializer(serializers.ModelSerializer):
    class Meta:
        model = GlobalIpPool
        fields = ["id", "name", "cidr", "gateway_ip", "pool_start", "pool_end", "created_at"]
        read_only_fields = ["id", "created_at"]
        extra_kwargs = {
            "name": {"validators": []},
            "pool_start": {"required": False},
            "pool_end": {"required": False},
        }


class HostNetworkSerializer(serializers.ModelSerializer):
    host = serializers.SlugRelatedField(slug_field="name", read_only=True)
    converged = fields.BooleanField(read_only=True)

    class Meta:
        model = HostNetwork
        fields = [
            "host",
            "vtep_address",
            "underlay_device",
            "underlay_mtu",
            "gateway",
            "external_bridge",
            "trunk_device",
            "sriov_pfs",
            "desired_generation",
            "applied_generation",
            "converged",
            "applied_at",
            "last_error",
            "reported_at",
        ]
        read_only_fields = fields
