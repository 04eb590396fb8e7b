"""Security groups and their rules: the project's ``default`` group, made with its first
network, and the groups and rules its members add.
"""

import ipaddress

from django.db import transaction

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from network.choices import Direction, Protocol
from network.models import SecurityGroup, SecurityGroupRule
from network.services._common import _hosts_changed
from tenants.models import Project

DEFAULT_GROUP = "default"


def default_security_group(project: Project) -> SecurityGroup:
    """The project's ``default`` group, made on first use: members reach each other,
    everything may leave, nothing else comes in."""
    group, created = SecurityGroup.objects.get_or_create(
        project=project,
        name=DEFAULT_GROUP,
        defaults={"description": "members reach each other; all egress"},
    )
    if created:
        SecurityGroupRule.objects.create(
            project=project, group=group, direction=Direction.EGRESS, protocol=Protocol.ANY
        )
        SecurityGroupRule.objects.create(
            project=project,
            group=group,
            direction=Direction.INGRESS,
            protocol=Protocol.ANY,
            remote_group=group,
        )
        audit.record("security_group.create", group, project=project, detail={"default": True})
    return group


@transaction.atomic
def security_group_create(*, project: Project, name: str, description: str = "") -> SecurityGroup:
    """A new group with no rules: its ports accept no new inbound flow and send none."""
    if SecurityGroup.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a security group named {name} exists", details={"name": ["taken"]})
    group = SecurityGroup.objects.create(project=project, name=name, description=description)
    audit.record("security_group.create", group, project=project)
    return group


@transaction.atomic
def security_group_delete(*, group: SecurityGroup) -> None:
    if group.name == DEFAULT_GROUP:
        raise Conflict("the default security group cannot be deleted", code="in_use")
    in_use = group.ports.count()
    if in_use:
        raise Conflict(
            f"security group {group.name} is on {in_use} port(s)",
            code="in_use",
            details={"ports": [str(in_use)]},
        )
    audit.record("security_group.delete", group, project=group.project)
    group.delete()
    _hosts_changed(project=group.project, gateway=False)


@transaction.atomic
def rule_create(
    *,
    group: SecurityGroup,
    direction: str,
    protocol: str = Protocol.ANY,
    port_min: int | None = None,
    port_max: int | None = None,
    remote_cidr: str = "",
    remote_group: SecurityGroup | None = None,
    description: str = "",
) -> SecurityGroupRule:
    """One allowed flow. Port ranges apply to tcp and udp only; the remote end is a CIDR or
    a group of the same project, not both."""
    if port_max is None:
        port_max = port_min
    if port_min is not None or port_max is not None:
        if protocol not in (Protocol.TCP, Protocol.UDP):
            raise InvalidInput.field("port_min", "port ranges apply to tcp and udp only")
        if port_min is None or port_min > port_max:
            raise InvalidInput.field("port_max", "the range must run from port_min up")
    if remote_cidr and remote_group is not None:
        raise InvalidInput.field("remote_group", "give remote_cidr or remote_group, not both")
    if remote_cidr:
        try:
            remote_cidr = str(ipaddress.IPv4Network(remote_cidr, strict=False))
        except ValueError as e:
            raise InvalidInput.field("remote_cidr", f"{remote_cidr!r} is not IPv4: {e}") from e
    if remote_group is not None and remote_group.project_id != group.project_id:
        raise InvalidInput.field("remote_group", "no such security group in this project")
    rule = SecurityGroupRule.objects.create(
        project=group.project,
        group=group,
        direction=direction,
        protocol=protocol,
        port_min=port_min,
        port_max=port_max,
        remote_cidr=remote_cidr,
        remote_group=remote_group,
        description=description,
    )
    audit.record(
        "security_group_rule.create",
        rule,
        project=group.project,
        detail={"group": group.name, "rule": str(rule)},
    )
    _hosts_changed(project=group.project, gateway=False)
    return rule


@transaction.atomic
def rule_delete(*, rule: SecurityGroupRule) -> None:
    audit.record(
        "security_group_rule.delete", rule, project=rule.project, detail={"rule": str(rule)}
    )
    rule.delete()
    _hosts_changed(project=rule.project, gateway=False)
