"""Tenant networks, subnets and their addresses, ports, security groups, global IPs with
1:1 NAT and port forwards, external connections, and each host's network agent.

Allocation is by unique constraint: a VNI, a MAC, a fixed IP or a global IP exists at most
once, so two concurrent allocations can never hand out the same one (the loser retries the
next free value; see ``network.allocation``).
"""

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from compute.models import Device, Host, VirtualMachine
from controlplane.validators import hostname_validator
from network.choices import (
    ConnectionKind,
    ConnectionState,
    Direction,
    ForwardProtocol,
    NetworkKind,
    PortBinding,
    Protocol,
)
from tenants.models import Project, ProjectOwnedModel


class Network(ProjectOwnedModel):
    """A project's layer-2 overlay: one VXLAN segment (``vni``) across every host with a
    port on it. ``mtu`` is the underlay's less the VXLAN overhead (1450 on 1500).

    ``external_access``: the project's router joins this network and source-NATs its
    traffic to the outside. An ``rdma`` network's ports are RDMA NIC virtual functions,
    and its RoCE QoS (DSCP, ECN, PFC priority) is recorded here for the hosts' NICs.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63, validators=[hostname_validator])
    description = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=8, choices=NetworkKind.choices, default=NetworkKind.OVERLAY)
    vni = models.PositiveIntegerField(unique=True)
    mtu = models.PositiveIntegerField()
    external_access = models.BooleanField(default=False)
    rdma_dscp = models.PositiveSmallIntegerField(
        default=26, validators=[MaxValueValidator(63)], help_text="RoCE traffic's DSCP"
    )
    rdma_ecn = models.BooleanField(default=True, help_text="ECN marking for RoCE (DCQCN)")
    rdma_pfc_priority = models.PositiveSmallIntegerField(
        default=3, validators=[MaxValueValidator(7)], help_text="the lossless PFC priority"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_network_name")
        ]

    def __str__(self):
        return f"{self.name} (VNI {self.vni})"


class Subnet(ProjectOwnedModel):
    """An IPv4 range on a network. Addresses are handed out from ``pool_start`` to
    ``pool_end``; the gateway (the project router's leg) is never handed out. Two subnets
    of one network never overlap."""

    network = models.ForeignKey(Network, on_delete=models.CASCADE, related_name="subnets")
    name = models.CharField(max_length=63, blank=True)
    cidr = models.CharField(max_length=18)
    gateway_ip = models.GenericIPAddressField(protocol="IPv4", null=True, blank=True)
    pool_start = models.GenericIPAddressField(protocol="IPv4")
    pool_end = models.GenericIPAddressField(protocol="IPv4")
    dns_servers = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["network", "cidr"]
        constraints = [
            models.UniqueConstraint(fields=["network", "cidr"], name="unique_subnet_cidr")
        ]

    def __str__(self):
        return self.cidr


class SecurityGroup(ProjectOwnedModel):
    """A named allow-list of flows (mdx's firewall ACLs). A port in no group is closed to
    new inbound flows; every project has a ``default`` group that lets its members talk
    to each other and lets everything out."""

    name = models.CharField(max_length=63)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_security_group")
        ]

    def __str__(self):
        return self.name


class SecurityGroupRule(ProjectOwnedModel):
    """One allowed flow: to (ingress) or from (egress) the group's ports, by protocol and
    destination port range, from or to ``remote_cidr`` or the ports of ``remote_group``."""

    group = models.ForeignKey(SecurityGroup, on_delete=models.CASCADE, related_name="rules")
    direction = models.CharField(max_length=8, choices=Direction.choices)
    protocol = models.CharField(max_length=8, choices=Protocol.choices, default=Protocol.ANY)
    port_min = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    port_max = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    remote_cidr = models.CharField(max_length=18, blank=True)
    remote_group = models.ForeignKey(
        SecurityGroup, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["group", "direction", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(remote_cidr="") | Q(remote_group__isnull=True),
                name="rule_remote_is_cidr_or_group",
            )
        ]

    def __str__(self):
        ports = f" {self.port_min}-{self.port_max}" if self.port_min else ""
        remote = self.remote_cidr or (
            f"group {self.remote_group_id}" if self.remote_group_id else "any"
        )
        return f"{self.direction} {self.protocol}{ports} {remote}"


class Port(ProjectOwnedModel):
    """A NIC on a network: a MAC, fixed IPs, security groups, and where it is bound.

    A VM's ports are made with the VM and bound to its host when it is placed; deleting
    the VM deletes them, and with them every 1:1 NAT and port forward that pointed at them,
    so a rule can never reach the next owner of a reused address. ``host`` is the binding;
    ``bound_generation`` the host's desired-state generation that first holds it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    network = models.ForeignKey(Network, on_delete=models.PROTECT, related_name="ports")
    name = models.CharField(max_length=63, blank=True)
    mac = models.CharField(max_length=17, unique=True)
    vm = models.ForeignKey(
        VirtualMachine, null=True, blank=True, on_delete=models.CASCADE, related_name="ports"
    )
    device_index = models.PositiveSmallIntegerField(default=0, help_text="NIC order in the VM")
    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    binding = models.CharField(max_length=8, choices=PortBinding.choices, default=PortBinding.TAP)
    binding_netns = models.CharField(
        max_length=64, blank=True, help_text="veth binding: the namespace of the peer"
    )
    vf = models.OneToOneField(
        Device, null=True, blank=True, on_delete=models.SET_NULL, related_name="port"
    )
    port_security = models.BooleanField(default=True)
    security_groups = models.ManyToManyField(SecurityGroup, blank=True, related_name="ports")
    bound_generation = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["host", "network"], name="port_host_network")]

    def __str__(self):
        return f"{self.name or self.pk} ({self.mac})"


class FixedIp(models.Model):
    """An address of a port. Unique per subnet: the constraint is the allocator's lock."""

    port = models.ForeignKey(Port, on_delete=models.CASCADE, related_name="fixed_ips")
    subnet = models.ForeignKey(Subnet, on_delete=models.CASCADE, related_name="fixed_ips")
    address = models.GenericIPAddressField(protocol="IPv4")

    class Meta:
        ordering = ["subnet", "address"]
        constraints = [
            models.UniqueConstraint(fields=["subnet", "address"], name="unique_fixed_ip")
        ]

    def __str__(self):
        return self.address


class GlobalIpPool(models.Model):
    """Operators' range of globally routable addresses on the gateway host's external
    network: projects are given addresses from it."""

    name = models.SlugField(max_length=63, unique=True)
    cidr = models.CharField(max_length=18)
    gateway_ip = models.GenericIPAddressField(protocol="IPv4")
    pool_start = models.GenericIPAddressField(protocol="IPv4")
    pool_end = models.GenericIPAddressField(protocol="IPv4")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.cidr})"


class GlobalIp(ProjectOwnedModel):
    """A global address held by a project. With ``port`` set it is 1:1 NAT to that port's
    first address; otherwise port forwards may use it. ``router`` marks the address of the
    project router's own external leg (its SNAT source), which the project does not
    manage and which counts against no quota."""

    pool = models.ForeignKey(GlobalIpPool, on_delete=models.PROTECT, related_name="addresses")
    address = models.GenericIPAddressField(protocol="IPv4", unique=True)
    port = models.OneToOneField(
        Port, null=True, blank=True, on_delete=models.SET_NULL, related_name="global_ip"
    )
    router = models.BooleanField(default=False)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["address"]
        verbose_name = "global IP"

    def __str__(self):
        return self.address


class PortForward(ProjectOwnedModel):
    """DNAT: ``protocol`` traffic to ``global_ip:external_port`` reaches
    ``port:internal_port``. Deleted with its port."""

    global_ip = models.ForeignKey(GlobalIp, on_delete=models.CASCADE, related_name="forwards")
    protocol = models.CharField(max_length=4, choices=ForwardProtocol.choices)
    external_port = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    port = models.ForeignKey(Port, on_delete=models.CASCADE, related_name="forwards")
    internal_port = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["global_ip", "protocol", "external_port"]
        constraints = [
            models.UniqueConstraint(
                fields=["global_ip", "protocol", "external_port"], name="unique_port_forward"
            )
        ]

    def __str__(self):
        return f"{self.global_ip}:{self.external_port}/{self.protocol}"


class Router(ProjectOwnedModel):
    """A project's router on the gateway host (made the first time the project needs one:
    a network with external access, or a global IP in use). Its id names its namespace."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="router")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"router of {self.project}"


class ExternalConnection(ProjectOwnedModel):
    """A project's link to an outside network, requested by the project and realized on
    the gateway host only once an operator approves it: an L2VPN (``network`` carried on
    VLAN ``vlan_id`` of the gateway's trunk, e.g. to a supercomputer), an L3 route
    (``destination_cidr`` via ``next_hop`` from the project's router) or a site VPN
    (recorded and approved here; the tunnel itself is configured by the site's operators)."""

    name = models.CharField(max_length=63)
    kind = models.CharField(max_length=8, choices=ConnectionKind.choices)
    network = models.ForeignKey(
        Network, null=True, blank=True, on_delete=models.CASCADE, related_name="connections"
    )
    vlan_id = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(4094)]
    )
    destination_cidr = models.CharField(max_length=18, blank=True)
    next_hop = models.GenericIPAddressField(protocol="IPv4", null=True, blank=True)
    remote = models.CharField(max_length=200, blank=True, help_text="the other end, in words")
    state = models.CharField(
        max_length=10, choices=ConnectionState.choices, default=ConnectionState.REQUESTED
    )
    review_note = models.CharField(max_length=500, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_connection_name"),
            models.UniqueConstraint(
                fields=["vlan_id"],
                condition=Q(state="approved", kind="l2vpn"),
                name="unique_approved_l2vpn_vlan",
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.kind}, {self.state})"


class HostNetwork(models.Model):
    """A host's network agent, as it reports itself, and the desired-state generations.

    ``desired_generation`` counts changes to what the host should hold (bumped in the
    transaction that changes it); ``applied_generation`` is the newest the agent reported
    applied. While they differ the controller sends the desired state again, so a lost
    message or a dead agent delays convergence and never loses it.
    """

    host = models.OneToOneField(Host, on_delete=models.CASCADE, related_name="network")
    vtep_address = models.GenericIPAddressField(protocol="IPv4", null=True, blank=True)
    underlay_device = models.CharField(max_length=15, blank=True)
    underlay_mtu = models.PositiveIntegerField(default=1500)
    gateway = models.BooleanField(default=False, help_text="runs project routers and NAT")
    external_bridge = models.CharField(max_length=15, blank=True)
    trunk_device = models.CharField(max_length=15, blank=True)
    sriov_pfs = models.JSONField(default=dict, blank=True, help_text="PF netdev: VF count")
    desired_generation = models.PositiveIntegerField(default=1)
    # When desired_generation last changed: a report taken before it is stale.
    desired_at = models.DateTimeField(null=True, blank=True)
    applied_generation = models.PositiveIntegerField(default=0)
    applied_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host__name"]

    def __str__(self):
        return f"network of {self.host}"

    @property
    def converged(self) -> bool:
        return self.applied_generation >= self.desired_generation
