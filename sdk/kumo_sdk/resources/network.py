"""Networks, subnets, ports, security groups and their rules, global IPs, port forwards."""

from __future__ import annotations

from typing import Any

from kumo_sdk.resource import CREATE, CRUD, DELETE, READ, UPDATE, Resource
from kumo_sdk.types import (
    ExternalConnection,
    GlobalIp,
    Network,
    Port,
    PortForward,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)


class Networks(Resource[Network]):
    """``create(name, cidr=..., kind=..., external_access=..., description=...)``: a network,
    with a first subnet when ``cidr`` is given; ``external_access`` joins the project router,
    which source-NATs it to the outside. Deleting one with ports answers Conflict."""

    path, type, uuid_key = "networks/", Network, True
    verbs = CRUD


class Subnets(Resource[Subnet]):
    """``create(network, cidr, name=...)``: a subnet of the network named ``network``;
    overlapping another answers InvalidInput. ``update(id, dns_servers=[...])`` sets the
    DNS servers its guests are told (``[]``: the network's own resolver)."""

    path, type, create_args = "subnets/", Subnet, ("network", "cidr")
    verbs = READ | {CREATE, UPDATE, DELETE}


class Ports(Resource[Port]):
    path, type, uuid_key = "ports/", Port, True
    verbs = CRUD


class SecurityGroupRules(Resource[SecurityGroupRule]):
    """``create(group, direction=..., protocol=..., port_min=..., port_max=...,
    remote_cidr=..., remote_group=..., description=...)``: a rule in the group named
    ``group``; ``direction`` ingress or egress, ``protocol`` any, tcp, udp or icmp; port
    ranges for tcp and udp only."""

    path, type, find_by, create_args = "security-group-rules/", SecurityGroupRule, None, ("group",)
    verbs = READ | {CREATE, DELETE}
    noun = "security group rule"


class SecurityGroups(Resource[SecurityGroup]):
    """Security groups and their rules (allow-lists; the ``default`` group cannot go)."""

    path, type, noun = "security-groups/", SecurityGroup, "security group"
    verbs = READ | {CREATE, DELETE}

    def add_rule(self, group: str, **fields: Any) -> SecurityGroupRule:
        """``security_group_rules.create``, kept under its group."""
        return self._c.security_group_rules.create(group, **fields)

    def delete_rule(self, rule_id: int, *, project: str | None = None) -> None:
        self._c.security_group_rules.delete(rule_id, project=project)


class GlobalIps(Resource[GlobalIp]):
    """A project's global addresses; ``find`` matches the address."""

    path, type, find_by, create_args, noun = "global-ips/", GlobalIp, "address", (), "global IP"
    verbs = READ | {CREATE, DELETE}

    def allocate(self, *, project: str | None = None, description: str = "") -> GlobalIp:
        """A new address from the operators' pools (QuotaExceeded past the project's quota)."""
        return self.create(project=project, description=description)

    def release(self, global_ip_id: int, *, project: str | None = None) -> None:
        self.delete(global_ip_id, project=project)

    def associate(
        self, global_ip_id: int, port: str | None, *, project: str | None = None
    ) -> GlobalIp:
        """1:1 NAT the address to ``port`` (a port id); ``None`` dissociates it."""
        body = {"port": port}
        return self._decode(self._action(global_ip_id, "associate", body, project=project))


class PortForwards(Resource[PortForward]):
    """``create(global_ip, protocol=..., external_port=..., port=..., internal_port=...,
    description=...)``: DNAT ``global_ip:external_port`` (an address of the project) to
    ``port`` (a port id) at ``internal_port``."""

    path, type, find_by, create_args = "port-forwards/", PortForward, None, ("global_ip",)
    verbs = READ | {CREATE, DELETE}
    noun = "port forward"


class ExternalConnections(Resource[ExternalConnection]):
    """``create(name, kind=..., network=..., vlan_id=..., destination_cidr=..., next_hop=...,
    remote=...)``: an L2VPN, L3 route or site VPN, requested by a project admin and realized
    once an operator approves it (``kumo.admin.external_connections.approve``)."""

    path, type, noun = "external-connections/", ExternalConnection, "external connection"
    verbs = READ | {CREATE, DELETE}
