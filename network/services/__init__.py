"""Every write to network objects, one module per part:

- ``networks``: networks and their subnets;
- ``security_groups``: security groups and their rules, the project's ``default`` group;
- ``ports``: ports, their addresses and binding to a host (an RDMA port's VF), a VM's ports;
- ``nat``: global IP pools, the project's router, global IPs (1:1 NAT) and port forwards;
- ``connections``: external connections, requested by a project and reviewed by operators;
- ``reports``: what host agents report about their network;
- ``_common``: what they share: which hosts a change touches, CIDR and address parsing.

Each service runs in one transaction with its audit event. A change to what a host should
hold bumps that host's desired generation in the same transaction (``_hosts_changed``);
after commit the controller sends the host its whole desired state (``network.sync``),
and keeps sending it until the agent reports that generation applied.
"""

from network.services.connections import connection_delete, connection_request, connection_review
from network.services.nat import (
    global_ip_allocate,
    global_ip_associate,
    global_ip_pool_create,
    global_ip_pool_delete,
    global_ip_release,
    port_forward_create,
    port_forward_delete,
    router_ensure,
)
from network.services.networks import (
    network_create,
    network_delete,
    network_update,
    subnet_create,
    subnet_delete,
    subnet_update,
)
from network.services.ports import (
    port_create,
    port_delete,
    port_update,
    ports_bind,
    ports_release,
    ports_unbind,
)
from network.services.reports import host_network_reported
from network.services.security_groups import (
    DEFAULT_GROUP,
    default_security_group,
    rule_create,
    rule_delete,
    security_group_create,
    security_group_delete,
)

__all__ = [
    "DEFAULT_GROUP",
    "connection_delete",
    "connection_request",
    "connection_review",
    "default_security_group",
    "global_ip_allocate",
    "global_ip_associate",
    "global_ip_pool_create",
    "global_ip_pool_delete",
    "global_ip_release",
    "host_network_reported",
    "network_create",
    "network_delete",
    "network_update",
    "port_create",
    "port_delete",
    "port_forward_create",
    "port_forward_delete",
    "port_update",
    "ports_bind",
    "ports_release",
    "ports_unbind",
    "router_ensure",
    "rule_create",
    "rule_delete",
    "security_group_create",
    "security_group_delete",
    "subnet_create",
    "subnet_delete",
    "subnet_update",
]
