from django.db import models


class NetworkKind(models.TextChoices):
    OVERLAY = "overlay", "Overlay (VXLAN)"
    RDMA = "rdma", "RDMA (RoCE over VXLAN)"


class PortBinding(models.TextChoices):
    """How a port reaches its network on its host (mirrors ``network.drivers.base.Port``)."""

    TAP = "tap", "Tap device of a VM"
    VETH = "veth", "veth pair into a network namespace"
    VF = "vf", "RDMA NIC virtual function"


class Direction(models.TextChoices):
    INGRESS = "ingress", "Ingress"
    EGRESS = "egress", "Egress"


class Protocol(models.TextChoices):
    ANY = "any", "Any"
    TCP = "tcp", "TCP"
    UDP = "udp", "UDP"
    ICMP = "icmp", "ICMP"


class ForwardProtocol(models.TextChoices):
    TCP = "tcp", "TCP"
    UDP = "udp", "UDP"


class ConnectionKind(models.TextChoices):
    L2VPN = "l2vpn", "L2VPN (a VLAN to an outside network)"
    L3_ROUTE = "l3_route", "L3 route (a project route to an outside network)"
    SITE_VPN = "site_vpn", "Site VPN"


class ConnectionState(models.TextChoices):
    REQUESTED = "requested", "Requested"  # waits for an operator
    APPROVED = "approved", "Approved"  # realized on the gateway host
    REJECTED = "rejected", "Rejected"


class PortStatus(models.TextChoices):
    DOWN = "down", "Down"  # not bound, or its host has not applied it yet
    ACTIVE = "active", "Active"  # its host applied the generation that holds it
