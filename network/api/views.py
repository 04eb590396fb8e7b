"""The network API. Every project endpoint reads through the project-scoped queryset
(``ProjectScopedViewSet``) and writes through ``network.services``; names in a request
(a network, a security group, a port) are looked up in the caller's project only, so
another project's object answers 400 exactly like a missing one."""

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.api.viewsets import OperatorViewSet, ServiceViewSet
from controlplane.errors import InvalidInput
from network import services, sync
from network.api import serializers as s
from network.models import (
    ExternalConnection,
    FixedIp,
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
from network.selectors import port_statuses
from tenants.choices import Role


def _named(model, project, field: str, value, *, key: str = "name"):
    """The project's ``model`` whose ``key`` is ``value``, or a 400 naming ``field``."""
    found = model.objects.for_project(project).filter(**{key: value}).first()
    if found is None:
        raise InvalidInput.field(field, f"no {model._meta.verbose_name} {value!r} in this project")
    return found


class NetworkViewSet(mixins.UpdateModelMixin, ServiceViewSet):
    """The project's networks: one VXLAN segment each, with its VNI and MTU. Deleting a
    network with ports answers 409."""

    model = Network
    serializer_class = s.NetworkSerializer
    ordering_fields = ["name", "created_at"]
    audit_object_type = "network.network"
    lookup_value_regex = r"[0-9a-fA-F-]{36}"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    @extend_schema(request=s.NetworkCreateSerializer, responses={201: s.NetworkSerializer})
    def create(self, request, project_slug=None):
        network = services.network_create(
            project=self.project, **self._input(s.NetworkCreateSerializer)
        )
        return self._answer(network, status=201)

    @extend_schema(request=s.NetworkUpdateSerializer, responses={200: s.NetworkSerializer})
    def partial_update(self, request, project_slug=None, pk=None):
        network = services.network_update(
            network=self.get_object(), **self._input(s.NetworkUpdateSerializer)
        )
        return self._answer(network)

    def perform_destroy(self, instance):
        services.network_delete(network=instance)


class SubnetViewSet(mixins.UpdateModelMixin, ServiceViewSet):
    """Subnets of the project's networks; two subnets of one network never overlap (400).
    A subnet's guests are told the network's own resolver unless ``dns_servers`` is set
    (PATCH)."""

    model = Subnet
    serializer_class = s.SubnetSerializer
    ordering_fields = ["cidr", "created_at"]
    audit_object_type = "network.subnet"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return super().get_queryset().select_related("network")

    @extend_schema(request=s.SubnetCreateSerializer, responses={201: s.SubnetSerializer})
    def create(self, request, project_slug=None):
        v = dict(self._input(s.SubnetCreateSerializer))
        v["network"] = _named(Network, self.project, "network", v["network"])
        subnet = services.subnet_create(**v)
        return self._answer(subnet, status=201)

    @extend_schema(request=s.SubnetUpdateSerializer, responses={200: s.SubnetSerializer})
    def partial_update(self, request, project_slug=None, pk=None):
        v = self._input(s.SubnetUpdateSerializer)
        if "dns_servers" not in v:
            raise InvalidInput.field("dns_servers", "this field is required")
        subnet = services.subnet_update(subnet=self.get_object(), dns_servers=v["dns_servers"])
        return self._answer(subnet)

    def perform_destroy(self, instance):
        services.subnet_delete(subnet=instance)


class PortViewSet(mixins.UpdateModelMixin, ServiceViewSet):
    """The project's ports: a VM's NICs (made with the VM, deleted with it) and ports of
    their own. ``status`` is active once the port's host has applied it."""

    model = Port
    serializer_class = s.PortSerializer
    ordering_fields = ["created_at", "mac"]
    audit_object_type = "network.port"
    lookup_value_regex = r"[0-9a-fA-F-]{36}"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return (
            super()
            .get_queryset()
            .select_related("network", "host", "global_ip")
            .prefetch_related(
                Prefetch("fixed_ips", queryset=FixedIp.objects.order_by("address")),
                "security_groups",
            )
        )

    def get_serializer(self, *args, **kwargs):
        instance = args[0] if args else None
        if instance is not None:
            ports = instance if kwargs.get("many") else [instance]
            kwargs["context"] = {**self.get_serializer_context(), "statuses": port_statuses(ports)}
        return super().get_serializer(*args, **kwargs)

    @extend_schema(request=s.PortCreateSerializer, responses={201: s.PortSerializer})
    def create(self, request, project_slug=None):
        v = dict(self._input(s.PortCreateSerializer))
        v["network"] = _named(Network, self.project, "network", v["network"])
        port = services.port_create(**v)
        return self._answer(port, status=201)

    @extend_schema(request=s.PortUpdateSerializer, responses={200: s.PortSerializer})
    def partial_update(self, request, project_slug=None, pk=None):
        port = services.port_update(port=self.get_object(), **self._input(s.PortUpdateSerializer))
        return self._answer(port)

    def perform_destroy(self, instance):
        services.port_delete(port=instance)


class SecurityGroupViewSet(ServiceViewSet):
    """Security groups (firewall ACLs): allow-lists of flows to and from their ports. The
    ``default`` group lets its members reach each other and lets everything out."""

    model = SecurityGroup
    serializer_class = s.SecurityGroupSerializer
    ordering_fields = ["name", "created_at"]
    audit_object_type = "network.securitygroup"

    def get_queryset(self):
        return (
            super()
            .get_queryset()
            .prefetch_related(
                Prefetch(
                    "rules",
                    queryset=SecurityGroupRule.objects.select_related("group", "remote_group"),
                )
            )
        )

    def create(self, request, project_slug=None):
        v = self._input(s.SecurityGroupSerializer)
        return self._answer(services.security_group_create(project=self.project, **v), status=201)

    def perform_destroy(self, instance):
        services.security_group_delete(group=instance)


class SecurityGroupRuleViewSet(ServiceViewSet):
    """The rules of the project's security groups."""

    model = SecurityGroupRule
    serializer_class = s.RuleSerializer
    ordering_fields = ["created_at"]
    audit_object_type = "network.securitygrouprule"

    def get_queryset(self):
        return super().get_queryset().select_related("group", "remote_group")

    @extend_schema(request=s.RuleCreateSerializer, responses={201: s.RuleSerializer})
    def create(self, request, project_slug=None):
        v = dict(self._input(s.RuleCreateSerializer))
        v["group"] = _named(SecurityGroup, self.project, "group", v["group"])
        if v.get("remote_group"):
            v["remote_group"] = _named(
                SecurityGroup, self.project, "remote_group", v["remote_group"]
            )
        return self._answer(services.rule_create(**v), status=201)

    def perform_destroy(self, instance):
        services.rule_delete(rule=instance)


class GlobalIpViewSet(ServiceViewSet):
    """Global IPs the project holds: 1:1 NAT to a port (``associate``) or port forwards.
    The router's own address (``router: true``) is listed but not the project's to change."""

    model = GlobalIp
    serializer_class = s.GlobalIpSerializer
    ordering_fields = ["address", "created_at"]
    audit_object_type = "network.globalip"

    def get_queryset(self):
        return super().get_queryset().select_related("pool")

    @extend_schema(request=s.GlobalIpCreateSerializer, responses={201: s.GlobalIpSerializer})
    def create(self, request, project_slug=None):
        v = self._input(s.GlobalIpCreateSerializer)
        return self._answer(services.global_ip_allocate(project=self.project, **v), status=201)

    @extend_schema(request=s.GlobalIpAssociateSerializer, responses={200: s.GlobalIpSerializer})
    @action(detail=True, methods=["post"])
    def associate(self, request, project_slug=None, pk=None):
        address = self.get_object()  # first: another project's address is 404 whatever the body
        v = self._input(s.GlobalIpAssociateSerializer)
        port = None
        if v["port"] is not None:
            port = _named(Port, self.project, "port", v["port"], key="pk")
        return self._answer(services.global_ip_associate(address=address, port=port))

    def perform_destroy(self, instance):
        services.global_ip_release(address=instance)


class PortForwardViewSet(ServiceViewSet):
    """DNAT port forwards from the project's global IPs to its ports; deleted with the
    port they point at."""

    model = PortForward
    serializer_class = s.PortForwardSerializer
    ordering_fields = ["external_port", "created_at"]
    audit_object_type = "network.portforward"

    def get_queryset(self):
        return super().get_queryset().select_related("global_ip")

    @extend_schema(request=s.PortForwardCreateSerializer, responses={201: s.PortForwardSerializer})
    def create(self, request, project_slug=None):
        v = dict(self._input(s.PortForwardCreateSerializer))
        address = _named(GlobalIp, self.project, "global_ip", v.pop("global_ip"), key="address")
        v["port"] = _named(Port, self.project, "port", v["port"], key="pk")
        return self._answer(services.port_forward_create(address=address, **v), status=201)

    def perform_destroy(self, instance):
        services.port_forward_delete(forward=instance)


class ExternalConnectionViewSet(ServiceViewSet):
    """Requests for links to outside networks (L2VPN, L3 routes, site VPN); realized once
    an operator approves them."""

    model = ExternalConnection
    serializer_class = s.ExternalConnectionSerializer
    ordering_fields = ["name", "created_at"]
    audit_object_type = "network.externalconnection"
    write_role = Role.ADMIN

    def get_queryset(self):
        return super().get_queryset().select_related("network", "project")

    @extend_schema(
        request=s.ExternalConnectionCreateSerializer,
        responses={201: s.ExternalConnectionSerializer},
    )
    def create(self, request, project_slug=None):
        v = dict(self._input(s.ExternalConnectionCreateSerializer))
        if v.get("network"):
            v["network"] = _named(Network, self.project, "network", v["network"])
        return self._answer(services.connection_request(project=self.project, **v), status=201)

    def perform_destroy(self, instance):
        services.connection_delete(connection=instance)


# --- operators --------------------------------------------------------------------------------


class OperatorGlobalIpPoolViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    OperatorViewSet,
):
    """Ranges of global addresses projects are given addresses from."""

    queryset = GlobalIpPool.objects.all()
    serializer_class = s.GlobalIpPoolSerializer
    audit_object_type = "network.globalippool"

    def perform_create(self, serializer):
        v = serializer.validated_data
        serializer.instance = services.global_ip_pool_create(
            name=v["name"],
            cidr=v["cidr"],
            gateway_ip=v["gateway_ip"],
            pool_start=v.get("pool_start") or "",
            pool_end=v.get("pool_end") or "",
        )

    def perform_destroy(self, instance):
        services.global_ip_pool_delete(pool=instance)


class OperatorExternalConnectionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet
):
    """Every project's connection requests; approve realizes one on the gateway host."""

    queryset = ExternalConnection.objects.select_related("network", "project")
    serializer_class = s.ExternalConnectionSerializer
    audit_object_type = "network.externalconnection"
    filterset_fields = ["state", "kind"]

    def _review(self, approve: bool):
        v = s.ReviewSerializer(data=self.request.data)
        v.is_valid(raise_exception=True)
        connection = services.connection_review(
            connection=self.get_object(),
            approve=approve,
            note=v.validated_data["note"],
            actor=self.request.user,
        )
        return Response(self.get_serializer(connection).data)

    @extend_schema(request=s.ReviewSerializer, responses={200: s.ExternalConnectionSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._review(True)

    @extend_schema(request=s.ReviewSerializer, responses={200: s.ExternalConnectionSerializer})
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._review(False)


class OperatorHostNetworkViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet):
    """Each host's network agent: its underlay, capabilities and whether it has applied
    what it should hold. ``resync`` sends a host its desired state again."""

    queryset = HostNetwork.objects.select_related("host")
    serializer_class = s.HostNetworkSerializer
    lookup_field = "host__name"
    lookup_url_kwarg = "host"
    audit_object_type = "network.hostnetwork"

    @extend_schema(request=None, responses={202: s.HostNetworkSerializer})
    @action(detail=True, methods=["post"])
    def resync(self, request, host=None):
        row = self.get_object()
        sync.send_desired([row.host_id])
        return Response(self.get_serializer(row).data, status=202)
