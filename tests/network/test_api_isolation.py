"""Isolation contracts of the network's project endpoints."""

import itertools

from network import services
from network.models import (
    ExternalConnection,
    GlobalIp,
    Network,
    Port,
    PortForward,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)
from tenants.choices import Role
from tests.factories import make_network, make_pool
from tests.isolation import ProjectEndpointContract

UUID_MISSING = "00000000-0000-4000-8000-000000000000"
_n = itertools.count(1)


def _roomy(project):
    """Room for the dozen objects the constant-query check makes."""
    from tenants.models import Quota

    Quota.objects.filter(project=project).update(networks=100, global_ips=100)
    return project


def _net(project, name=None):
    _roomy(project)
    existing = Network.objects.for_project(project).order_by("created_at").first()
    return (
        existing if existing and name is None else make_network(project, name, cidr="10.5.0.0/24")
    )


class TestNetworkIsolation(ProjectEndpointContract):
    basename = "project-network"
    actions = ("list", "retrieve", "create", "update", "delete")
    missing_lookup = UUID_MISSING
    create_references_nothing = True

    def make_object(self, project):
        return make_network(_roomy(project), f"n{next(_n)}", cidr="")

    def create_payload(self, project):
        return {"name": f"new{next(_n)}", "cidr": "10.9.0.0/24"}

    def update_payload(self, obj):
        return {"description": "changed"}

    def count(self, project):
        return Network.objects.for_project(project).count()


class TestSubnetIsolation(ProjectEndpointContract):
    basename = "project-subnet"
    actions = ("list", "retrieve", "create", "update", "delete")

    def make_object(self, project):
        net = make_network(_roomy(project), f"n{next(_n)}", cidr="")
        return services.subnet_create(network=net, cidr="10.6.0.0/24")

    def create_payload(self, project):
        net = make_network(_roomy(project), f"n{next(_n)}", cidr="")
        return {"network": net.name, "cidr": "10.7.0.0/24"}

    def update_payload(self, obj):
        return {"dns_servers": ["9.9.9.9"]}

    def foreign_payloads(self, project, other):
        theirs = make_network(other, f"theirs{next(_n)}", cidr="")
        return [{"network": theirs.name, "cidr": "10.8.0.0/24"}]

    def count(self, project):
        return Subnet.objects.for_project(project).count()


class TestPortIsolation(ProjectEndpointContract):
    basename = "project-port"
    actions = ("list", "retrieve", "create", "update", "delete")
    missing_lookup = UUID_MISSING

    def make_object(self, project):
        return services.port_create(network=_net(project))

    def create_payload(self, project):
        return {"network": _net(project).name}

    def update_payload(self, obj):
        return {"name": "renamed"}

    def foreign_payloads(self, project, other):
        _net(project)
        theirs = make_network(other, f"theirs{next(_n)}")
        services.security_group_create(project=other, name="theirs")
        return [
            {"network": theirs.name},
            {"network": _net(project).name, "security_groups": ["theirs"]},
        ]

    def count(self, project):
        return Port.objects.for_project(project).count()


class TestSecurityGroupIsolation(ProjectEndpointContract):
    basename = "project-securitygroup"
    actions = ("list", "retrieve", "create", "delete")
    create_references_nothing = True

    def make_object(self, project):
        return services.security_group_create(project=project, name=f"sg{next(_n)}")

    def create_payload(self, project):
        return {"name": f"sg{next(_n)}"}

    def count(self, project):
        return SecurityGroup.objects.for_project(project).count()


class TestSecurityGroupRuleIsolation(ProjectEndpointContract):
    basename = "project-securitygrouprule"
    actions = ("list", "retrieve", "create", "delete")

    def _group(self, project):
        return services.default_security_group(project)

    def make_object(self, project):
        return services.rule_create(
            group=self._group(project), direction="ingress", protocol="tcp", port_min=22
        )

    def create_payload(self, project):
        self._group(project)
        return {"group": "default", "direction": "ingress", "protocol": "tcp", "port_min": 443}

    def foreign_payloads(self, project, other):
        self._group(project)
        services.security_group_create(project=other, name="theirs")
        return [
            {"group": "theirs", "direction": "ingress"},
            {"group": "default", "direction": "ingress", "remote_group": "theirs"},
        ]

    def count(self, project):
        return SecurityGroupRule.objects.for_project(project).count()


def _pool():
    from network.models import GlobalIpPool

    return GlobalIpPool.objects.first() or make_pool()


class TestGlobalIpIsolation(ProjectEndpointContract):
    object_actions = (("post", "associate/"),)
    basename = "project-globalip"
    actions = ("list", "retrieve", "create", "delete")
    create_references_nothing = True

    def make_object(self, project):
        _pool()
        return services.global_ip_allocate(project=_roomy(project))

    def create_payload(self, project):
        _pool()
        return {"description": "web"}

    def count(self, project):
        return GlobalIp.objects.for_project(project).filter(router=False).count()

    def foreign_action_payloads(self, obj, other):
        theirs = services.port_create(network=_net(_roomy(other)))
        return [("post", "associate/", {"port": str(theirs.pk)})]


class TestPortForwardIsolation(ProjectEndpointContract):
    basename = "project-portforward"
    actions = ("list", "retrieve", "create", "delete")

    def _parts(self, project):
        _pool()
        address = GlobalIp.objects.for_project(project).filter(router=False).first()
        address = address or services.global_ip_allocate(project=project)
        port = Port.objects.for_project(project).first()
        return address, port or services.port_create(network=_net(project))

    def make_object(self, project):
        address, port = self._parts(project)
        return services.port_forward_create(
            address=address,
            protocol="tcp",
            external_port=1000 + next(_n),
            port=port,
            internal_port=22,
        )

    def create_payload(self, project):
        address, port = self._parts(project)
        return {
            "global_ip": address.address,
            "protocol": "tcp",
            "external_port": 2000 + next(_n),
            "port": str(port.pk),
            "internal_port": 80,
        }

    def foreign_payloads(self, project, other):
        mine = self.create_payload(project)
        theirs = self.create_payload(other)
        return [
            {**mine, "port": theirs["port"]},
            {**mine, "global_ip": theirs["global_ip"]},
        ]

    def count(self, project):
        return PortForward.objects.for_project(project).count()


class TestExternalConnectionIsolation(ProjectEndpointContract):
    basename = "project-externalconnection"
    actions = ("list", "retrieve", "create", "delete")
    write_role = Role.ADMIN

    def make_object(self, project):
        return services.connection_request(
            project=project,
            name=f"c{next(_n)}",
            kind="l3_route",
            destination_cidr="172.30.0.0/16",
            next_hop="198.51.100.254",
        )

    def create_payload(self, project):
        return {
            "name": f"c{next(_n)}",
            "kind": "l2vpn",
            "network": _net(project).name,
            "vlan_id": 100,
            "remote": "the campus supercomputer",
        }

    def foreign_payloads(self, project, other):
        theirs = make_network(other, f"theirs{next(_n)}")
        return [{"name": "x", "kind": "l2vpn", "network": theirs.name, "vlan_id": 101}]

    def count(self, project):
        return ExternalConnection.objects.for_project(project).count()
