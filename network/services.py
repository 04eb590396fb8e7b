"""Every write to network objects: networks, subnets, ports, security groups, global IPs,
port forwards, external connections, and what host agents report.

Each service runs in one transaction with its audit event. A change to what a host should
hold bumps that host's desired generation in the same transaction (``_hosts_changed``);
after commit the controller sends the host its whole desired state (``network.sync``),
and keeps sending it until the agent reports that generation applied.
"""

import ipaddress
import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from compute import placement
from compute.models import Host, VirtualMachine
from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from network import allocation
from network.choices import (
    ConnectionKind,
    ConnectionState,
    Direction,
    NetworkKind,
    PortBinding,
    Protocol,
)
from network.drivers.base import overlay_mtu
from network.models import (
    ExternalConnection,
    FixedIp,
    GlobalIp,
    GlobalIpPool,
    HostNetwork,
    Network,
    Port,
    PortForward,
    Router,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)
from tenants import quotas, usage
from tenants.choices import UsageResource
from tenants.models import Project

log = logging.getLogger(__name__)

DEFAULT_GROUP = "default"


# --- which hosts a change touches ---------------------------------------------------------------


def _hosts_changed(*, project: Project | None = None, host_ids=(), gateway: bool = True) -> None:
    """Bump the desired generation of every host holding ``project``'s ports, of
    ``host_ids``, and of the gateway hosts; send them their state after commit.

    A project's networks, security groups and NAT only ever concern the hosts with its
    ports and the gateway hosts, so this is exact enough: a host told to resync with
    nothing to change writes nothing.
    """
    ids = set(host_ids)
    if project is not None:
        ids |= set(
            Port.objects.for_project(project)
            .filter(host__isnull=False)
            .values_list("host_id", flat=True)
            .distinct()
        )
    wanted = Q(host_id__in=ids)
    if gateway:
        wanted |= Q(gateway=True)
    changed = list(HostNetwork.objects.filter(wanted).values_list("host_id", flat=True))
    if not changed:
        return
    HostNetwork.objects.filter(host_id__in=changed).update(
        desired_generation=F("desired_generation") + 1, desired_at=timezone.now()
    )

    def send():
        from network import sync

        sync.send_desired(changed)

    transaction.on_commit(send, robust=True)


# --- networks and subnets ---------------------------------------------------------------------


def _require_rdma_capable() -> None:
    if not HostNetwork.objects.exclude(sriov_pfs={}).exists():
        raise Conflict(
            "no host has an RDMA NIC with SR-IOV virtual functions reported by its network "
            "agent, so RDMA networks cannot be offered",
            code="rdma_unavailable",
            details={"kind": ["no host reports SR-IOV RDMA NICs"]},
        )


@transaction.atomic
def network_create(
    *,
    project: Project,
    name: str,
    kind: str = NetworkKind.OVERLAY,
    description: str = "",
    external_access: bool = False,
    cidr: str = "",
    rdma_dscp: int | None = None,
    rdma_ecn: bool | None = None,
    rdma_pfc_priority: int | None = None,
) -> Network:
    """A network with a VNI of its own (409 when the VNI range is used up) and, when
    ``cidr`` is given, its first subnet. The project's ``default`` security group is made
    with its first network."""
    if kind == NetworkKind.RDMA:
        _require_rdma_capable()
    if Network.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a network named {name} exists", details={"name": ["taken"]})
    quotas.check(project, networks=1)
    qos = {
        k: v
        for k, v in {
            "rdma_dscp": rdma_dscp,
            "rdma_ecn": rdma_ecn,
            "rdma_pfc_priority": rdma_pfc_priority,
        }.items()
        if v is not None
    }
    taken = set(Network.objects.values_list("vni", flat=True))
    network = allocation.claim(
        allocation.free_vnis(taken),
        lambda vni: Network.objects.create(
            project=project,
            name=name,
            kind=kind,
            description=description,
            external_access=external_access,
            vni=vni,
            mtu=overlay_mtu(settings.UNDERLAY_MTU),
            **qos,
        ),
        exhausted="no VXLAN network identifier is free: the VNI range is used up",
    )
    default_security_group(project)
    if external_access:
        router_ensure(project)
    audit.record(
        "network.create",
        network,
        project=project,
        detail={"vni": network.vni, "kind": kind, "mtu": network.mtu},
    )
    if cidr:
        subnet_create(network=network, cidr=cidr)
    return network


@transaction.atomic
def network_update(*, network: Network, **changes) -> Network:
    """Change ``description`` or ``external_access``."""
    allowed = {"description", "external_access"}
    unknown = set(changes) - allowed
    if unknown:
        raise InvalidInput.field(sorted(unknown)[0], "cannot be changed")
    for field, value in changes.items():
        setattr(network, field, value)
    network.save(update_fields=list(changes))
    if network.external_access:
        router_ensure(network.project)
    audit.record("network.update", network, project=network.project, detail=changes)
    _hosts_changed(project=network.project)
    return network


@transaction.atomic
def network_delete(*, network: Network) -> None:
    """Delete a network without ports (409 while any port is on it)."""
    ports = Port.objects.filter(network=network).count()
    if ports:
        raise Conflict(
            f"network {network.name} still has {ports} port(s); delete them first",
            code="in_use",
            details={"ports": [str(ports)]},
        )
    project = network.project
    audit.record("network.delete", network, project=project, detail={"vni": network.vni})
    network.delete()
    _hosts_changed(project=project)


def _parse_cidr(cidr: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError as e:
        raise InvalidInput.field("cidr", f"{cidr!r} is not an IPv4 network: {e}") from e
    if net.prefixlen > 29:
        raise InvalidInput.field("cidr", "the prefix must be /29 or shorter")
    return net


def _address_in(field: str, value: str, net: ipaddress.IPv4Network) -> str:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError as e:
        raise InvalidInput.field(field, f"{value!r} is not an IPv4 address") from e
    if address not in net or address in (net.network_address, net.broadcast_address):
        raise InvalidInput.field(field, f"{value} is not a host address of {net}")
    return str(address)


@transaction.atomic
def subnet_create(
    *,
    network: Network,
    cidr: str,
    name: str = "",
    gateway_ip: str | None = "",
    pool_start: str = "",
    pool_end: str = "",
    dns_servers: list[str] | None = None,
) -> Subnet:
    """A subnet; the gateway defaults to the first host address (None: no gateway) and the
    pool to every other host address. Overlapping another subnet of the network is 400."""
    net = _parse_cidr(cidr)
    Network.objects.select_for_update().filter(pk=network.pk).first()  # serialize overlaps
    for other in Subnet.objects.filter(network=network).values_list("cidr", flat=True):
        if net.overlaps(ipaddress.IPv4Network(other)):
            raise InvalidInput.field("cidr", f"{net} overlaps subnet {other} of this network")
    hosts = list(net.hosts())
    if gateway_ip == "":
        gateway_ip = str(hosts[0])
    elif gateway_ip is not None:
        gateway_ip = _address_in("gateway_ip", gateway_ip, net)
    start = _address_in("pool_start", pool_start, net) if pool_start else None
    end = _address_in("pool_end", pool_end, net) if pool_end else str(hosts[-1])
    if start is None:
        start = str(hosts[1] if gateway_ip == str(hosts[0]) else hosts[0])
    if ipaddress.IPv4Address(start) > ipaddress.IPv4Address(end):
        raise InvalidInput.field("pool_end", f"the pool ends at {end}, before it starts")
    servers = _dns_servers(dns_servers)
    subnet = Subnet.objects.create(
        project=network.project,
        network=network,
        name=name,
        cidr=str(net),
        gateway_ip=gateway_ip,
        pool_start=start,
        pool_end=end,
        dns_servers=servers,
    )
    audit.record("subnet.create", subnet, project=network.project, detail={"network": network.name})
    _hosts_changed(project=network.project)
    return subnet


def _dns_servers(servers: list[str] | None) -> list[str]:
    found = []
    for server in servers or []:
        try:
            found.append(str(ipaddress.IPv4Address(server)))
        except ValueError as e:
            raise InvalidInput.field("dns_servers", f"{server!r} is not an IPv4 address") from e
    if len(found) > 4:
        raise InvalidInput.field("dns_servers", "at most 4 servers")
    return found


@transaction.atomic
def subnet_update(*, subnet: Subnet, dns_servers: list[str]) -> Subnet:
    """Set the DNS servers the subnet's guests are told (``[]``: the network's own
    resolver, ``network.dns``). Guests read it when their VM is next applied (created,
    started, rebuilt); running guests keep what they were told."""
    subnet.dns_servers = _dns_servers(dns_servers)
    subnet.save(update_fields=["dns_servers"])
    audit.record(
        "subnet.update", subnet, project=subnet.project, detail={"dns_servers": subnet.dns_servers}
    )
    return subnet


@transaction.atomic
def subnet_delete(*, subnet: Subnet) -> None:
    used = FixedIp.objects.filter(subnet=subnet).count()
    if used:
        raise Conflict(
            f"subnet {subnet.cidr} has {used} address(es) in use",
            code="in_use",
            details={"fixed_ips": [str(used)]},
        )
    audit.record("subnet.delete", subnet, project=subnet.project)
    subnet.delete()
    _hosts_changed(project=subnet.project)


# --- security groups --------------------------------------------------------------------------


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


# --- ports ------------------------------------------------------------------------------------


def _groups(project: Project, names: list[str] | None) -> list[SecurityGroup]:
    if names is None:
        return [default_security_group(project)]
    found = {g.name: g for g in SecurityGroup.objects.for_project(project).filter(name__in=names)}
    for name in names:
        if name not in found:
            raise InvalidInput.field("security_groups", f"no security group named {name!r}")
    return [found[name] for name in names]


def _allocate_ip(port: Port, network: Network, fixed_ip: str) -> FixedIp | None:
    subnets = list(Subnet.objects.filter(network=network).order_by("created_at"))
    if not subnets:
        if fixed_ip:
            raise InvalidInput.field("fixed_ip", f"network {network.name} has no subnet")
        return None
    if fixed_ip:
        try:
            address = ipaddress.IPv4Address(fixed_ip)
        except ValueError as e:
            raise InvalidInput.field("fixed_ip", f"{fixed_ip!r} is not an IPv4 address") from e
        subnet = next((s for s in subnets if address in ipaddress.IPv4Network(s.cidr)), None)
        if subnet is None:
            raise InvalidInput.field("fixed_ip", f"{fixed_ip} is in no subnet of {network.name}")
        if str(address) == subnet.gateway_ip:
            raise InvalidInput.field("fixed_ip", f"{fixed_ip} is the subnet's gateway")
        return allocation.claim(
            [str(address)],
            lambda a: FixedIp.objects.create(port=port, subnet=subnet, address=a),
            exhausted=f"address {fixed_ip} is in use",
            code="address_in_use",
        )
    for subnet in subnets:
        taken = set(FixedIp.objects.filter(subnet=subnet).values_list("address", flat=True))
        candidates = allocation.free_addresses(
            subnet.pool_start, subnet.pool_end, taken, skip=(subnet.gateway_ip,)
        )
        try:
            return allocation.claim(
                candidates,
                lambda a, s=subnet: FixedIp.objects.create(port=port, subnet=s, address=a),
                exhausted="",
            )
        except Conflict:
            continue
    raise Conflict(
        f"no address is free on network {network.name}",
        code="exhausted",
        details={"network": ["no free address"]},
    )


@transaction.atomic
def port_create(
    *,
    network: Network,
    vm: VirtualMachine | None = None,
    name: str = "",
    fixed_ip: str = "",
    security_groups: list[str] | None = None,
    port_security: bool = True,
    binding: str = "",
    binding_netns: str = "",
    host: Host | None = None,
    device_index: int = 0,
) -> Port:
    """A port with a MAC of its own and an address from the network's first subnet with
    room (or ``fixed_ip``: 409 when taken). A VM's port is bound to the VM's host;
    ``host`` with ``binding`` ``veth`` binds a port to a network namespace on a host
    (containers, test stand-ins). Ports on an RDMA network take a VF when bound."""
    project = network.project
    if vm is not None and vm.project_id != project.pk:
        raise InvalidInput.field("network", "no such network in this project")
    if not binding:
        binding = PortBinding.VF if network.kind == NetworkKind.RDMA else PortBinding.TAP
    if network.kind == NetworkKind.RDMA:
        _require_rdma_capable()
        if binding != PortBinding.VF:
            raise InvalidInput.field("binding", "ports of an RDMA network are VFs")
    if binding == PortBinding.VETH and (host is None or not binding_netns):
        raise InvalidInput.field("binding_netns", "a veth port needs a host and a namespace")
    groups = _groups(project, security_groups)
    port = allocation.claim(
        allocation.random_macs(),
        lambda mac: Port.objects.create(
            project=project,
            network=network,
            name=name,
            mac=mac,
            vm=vm,
            device_index=device_index,
            binding=binding,
            binding_netns=binding_netns,
            port_security=port_security,
            host=host if vm is None else vm.host,
        ),
        exhausted="no free MAC address was found",
    )
    port.security_groups.set(groups)
    ip = _allocate_ip(port, network, fixed_ip)
    if port.host_id is not None:
        _bind(port)
    audit.record(
        "port.create",
        port,
        project=project,
        detail={
            "network": network.name,
            "mac": port.mac,
            "ip": ip.address if ip else None,
            "vm": str(vm.pk) if vm else None,
        },
    )
    _hosts_changed(project=project)
    return port


def _bind(port: Port) -> None:
    """Take a VF on the port's host for an RDMA port; record the host generation that
    first holds the port (it is active once its host reports that generation applied)."""
    if port.binding == PortBinding.VF and port.vf_id is None:
        vf = placement.rdma_vf_claim(host_id=port.host_id, vm_id=port.vm_id)
        if vf is None:
            raise Conflict(
                "no free RDMA virtual function on the VM's host",
                code="no_capacity",
                details={"network": ["no free VF"]},
            )
        port.vf = vf
    generation = (
        HostNetwork.objects.filter(host_id=port.host_id)
        .values_list("desired_generation", flat=True)
        .first()
    )
    port.bound_generation = (generation or 0) + 1
    port.save(update_fields=["host", "vf", "bound_generation"])


def ports_bind(vm: VirtualMachine) -> None:
    """Bind ``vm``'s ports to the host it was just placed on (inside the placing
    transaction)."""
    ports = list(Port.objects.filter(vm=vm))
    for port in ports:
        port.host_id = vm.host_id
        _bind(port)
    if ports:
        _hosts_changed(project=vm.project, host_ids=[vm.host_id])


def ports_release(vm: VirtualMachine) -> int:
    """Delete ``vm``'s ports, and with them their addresses, 1:1 NAT and port forwards,
    so nothing reaches whoever gets the address next. Returns how many were deleted."""
    ports = list(Port.objects.filter(vm=vm))
    for port in ports:
        _port_delete(port)
    return len(ports)


def _port_delete(port: Port) -> None:
    hosts = [port.host_id] if port.host_id else []
    forwards = list(PortForward.objects.filter(port=port).values_list("pk", flat=True))
    nat = GlobalIp.objects.filter(port=port).values_list("address", flat=True).first()
    audit.record(
        "port.delete",
        port,
        project=port.project,
        detail={"forwards_removed": len(forwards), "nat_removed": nat},
    )
    port.delete()  # fixed IPs and forwards cascade; a 1:1 global IP is set free
    _hosts_changed(project=port.project, host_ids=hosts)


@transaction.atomic
def port_delete(*, port: Port) -> None:
    """Delete a port that belongs to no VM (a VM's ports go with the VM: 409)."""
    if port.vm_id is not None and port.vm.state != "deleted":
        raise Conflict(
            f"port {port.pk} belongs to VM {port.vm.name}; delete the VM",
            code="in_use",
            details={"vm": [str(port.vm_id)]},
        )
    _port_delete(port)


@transaction.atomic
def port_update(
    *, port: Port, security_groups: list[str] | None = None, port_security=None, name=None
) -> Port:
    if security_groups is not None:
        port.security_groups.set(_groups(port.project, security_groups))
    if port_security is not None:
        port.port_security = port_security
    if name is not None:
        port.name = name
    port.save(update_fields=["port_security", "name"])
    audit.record(
        "port.update",
        port,
        project=port.project,
        detail={"security_groups": security_groups, "port_security": port_security},
    )
    _hosts_changed(project=port.project, host_ids=[port.host_id] if port.host_id else [])
    return port


# --- routers, global IPs and NAT --------------------------------------------------------------


def _pools():
    return GlobalIpPool.objects.order_by("created_at")


def _take_global_ip(project: Project, *, router: bool, pool: GlobalIpPool | None = None):
    pools = [pool] if pool is not None else list(_pools())
    if not pools:
        raise Conflict(
            "no global IP pool is configured; ask the operators",
            code="exhausted",
            details={"pool": ["none configured"]},
        )
    for candidate in pools:
        taken = set(GlobalIp.objects.filter(pool=candidate).values_list("address", flat=True))
        try:
            return allocation.claim(
                allocation.free_addresses(
                    candidate.pool_start, candidate.pool_end, taken, skip=(candidate.gateway_ip,)
                ),
                lambda a, p=candidate: GlobalIp.objects.create(
                    project=project, pool=p, address=a, router=router
                ),
                exhausted="",
            )
        except Conflict:
            continue
    raise Conflict(
        "every global IP pool is used up", code="exhausted", details={"pool": ["used up"]}
    )


def router_ensure(project: Project) -> Router:
    """The project's router, with its own external address; made on first need."""
    router = Router.objects.filter(project=project).first()
    if router is not None:
        return router
    address = _take_global_ip(project, router=True)
    router = Router.objects.create(project=project)
    audit.record("router.create", router, project=project, detail={"external": address.address})
    return router


@transaction.atomic
def global_ip_pool_create(
    *, name: str, cidr: str, gateway_ip: str, pool_start: str = "", pool_end: str = ""
) -> GlobalIpPool:
    net = _parse_cidr(cidr)
    gateway = _address_in("gateway_ip", gateway_ip, net)
    hosts = list(net.hosts())
    start = _address_in("pool_start", pool_start, net) if pool_start else str(hosts[0])
    end = _address_in("pool_end", pool_end, net) if pool_end else str(hosts[-1])
    if ipaddress.IPv4Address(start) > ipaddress.IPv4Address(end):
        raise InvalidInput.field("pool_end", f"the pool ends at {end}, before it starts")
    for other in GlobalIpPool.objects.values_list("cidr", flat=True):
        if net.overlaps(ipaddress.IPv4Network(other)):
            raise InvalidInput.field("cidr", f"{net} overlaps pool {other}")
    if GlobalIpPool.objects.filter(name=name).exists():
        raise Conflict(f"a pool named {name} exists", details={"name": ["taken"]})
    pool = GlobalIpPool.objects.create(
        name=name, cidr=str(net), gateway_ip=gateway, pool_start=start, pool_end=end
    )
    audit.record("global_ip_pool.create", pool, detail={"cidr": str(net)})
    return pool


@transaction.atomic
def global_ip_pool_delete(*, pool: GlobalIpPool) -> None:
    used = GlobalIp.objects.filter(pool=pool).count()
    if used:
        raise Conflict(f"pool {pool.name} has {used} address(es) given out", code="in_use")
    audit.record("global_ip_pool.delete", pool)
    pool.delete()


@transaction.atomic
def global_ip_allocate(*, project: Project, description: str = "") -> GlobalIp:
    """A global address for the project (quota ``global_ips``; 409 when pools are used up)."""
    quotas.check(project, global_ips=1)
    router_ensure(project)
    address = _take_global_ip(project, router=False)
    if description:
        address.description = description
        address.save(update_fields=["description"])
    usage.usage_open(address, UsageResource.GLOBAL_IP, 1, timezone.now())  # billed from now
    audit.record("global_ip.allocate", address, project=project)
    return address


def _first_address(port: Port) -> str:
    address = port.fixed_ips.order_by("address").values_list("address", flat=True).first()
    if address is None:
        raise InvalidInput.field("port", f"port {port.pk} has no IPv4 address")
    return address


@transaction.atomic
def global_ip_associate(*, address: GlobalIp, port: Port | None) -> GlobalIp:
    """1:1 NAT of ``address`` to ``port``'s first address (None: dissociate)."""
    locked = GlobalIp.objects.select_for_update().get(pk=address.pk)
    if port is not None:
        if port.project_id != locked.project_id:
            raise InvalidInput.field("port", "no such port in this project")
        _first_address(port)
        if locked.forwards.exists():
            raise Conflict(
                f"{locked.address} has port forwards; remove them before 1:1 NAT",
                code="in_use",
            )
        if GlobalIp.objects.filter(port=port).exclude(pk=locked.pk).exists():
            raise Conflict(f"port {port.pk} already has a global IP", code="in_use")
    locked.port = port
    locked.save(update_fields=["port"])
    audit.record(
        "global_ip.associate",
        locked,
        project=locked.project,
        detail={"port": str(port.pk) if port else None},
    )
    _hosts_changed(project=locked.project)
    return locked


@transaction.atomic
def global_ip_release(*, address: GlobalIp) -> None:
    """Give the address back; its 1:1 NAT and port forwards go with it."""
    if address.router:
        raise Conflict("the router's own address is released with the project", code="in_use")
    audit.record("global_ip.release", address, project=address.project)
    usage.usage_close(address, UsageResource.GLOBAL_IP, at=timezone.now())  # billed until now
    project = address.project
    address.delete()
    _hosts_changed(project=project)


@transaction.atomic
def port_forward_create(
    *,
    address: GlobalIp,
    protocol: str,
    external_port: int,
    port: Port,
    internal_port: int,
    description: str = "",
) -> PortForward:
    """DNAT ``address:external_port`` to ``port:internal_port``; 409 when taken."""
    if port.project_id != address.project_id:
        raise InvalidInput.field("port", "no such port in this project")
    if address.router:
        raise InvalidInput.field("global_ip", "the router's own address takes no forwards")
    if address.port_id is not None:
        raise Conflict(f"{address.address} is 1:1 NAT to a port", code="in_use")
    _first_address(port)
    forward = allocation.claim(
        [external_port],
        lambda n: PortForward.objects.create(
            project=address.project,
            global_ip=address,
            protocol=protocol,
            external_port=n,
            port=port,
            internal_port=internal_port,
            description=description,
        ),
        exhausted=f"{address.address}:{external_port}/{protocol} is forwarded already",
        code="in_use",
    )
    audit.record("port_forward.create", forward, project=address.project)
    _hosts_changed(project=address.project)
    return forward


@transaction.atomic
def port_forward_delete(*, forward: PortForward) -> None:
    audit.record("port_forward.delete", forward, project=forward.project)
    forward.delete()
    _hosts_changed(project=forward.project)


# --- external connections ---------------------------------------------------------------------


@transaction.atomic
def connection_request(
    *,
    project: Project,
    name: str,
    kind: str,
    network: Network | None = None,
    vlan_id: int | None = None,
    destination_cidr: str = "",
    next_hop: str | None = None,
    remote: str = "",
) -> ExternalConnection:
    """Ask the operators for a link to an outside network; nothing is realized before
    they approve it."""
    if kind == ConnectionKind.L2VPN and (network is None or vlan_id is None):
        raise InvalidInput.field("vlan_id", "an L2VPN needs a network and a VLAN id")
    if kind == ConnectionKind.L3_ROUTE:
        if not destination_cidr or not next_hop:
            raise InvalidInput.field("next_hop", "an L3 route needs destination_cidr and next_hop")
        try:
            destination_cidr = str(ipaddress.IPv4Network(destination_cidr, strict=True))
        except ValueError as e:
            raise InvalidInput.field("destination_cidr", str(e)) from e
    if network is not None and network.project_id != project.pk:
        raise InvalidInput.field("network", "no such network in this project")
    if ExternalConnection.objects.for_project(project).filter(name=name).exists():
        raise Conflict(f"a connection named {name} exists", details={"name": ["taken"]})
    connection = ExternalConnection.objects.create(
        project=project,
        name=name,
        kind=kind,
        network=network,
        vlan_id=vlan_id,
        destination_cidr=destination_cidr,
        next_hop=next_hop,
        remote=remote,
    )
    audit.record("external_connection.request", connection, project=project)
    return connection


@transaction.atomic
def connection_review(
    *, connection: ExternalConnection, approve: bool, note: str = "", actor=None
) -> ExternalConnection:
    """An operator approves (realized on the gateway host) or rejects a request. The row
    is locked first, so two operators reviewing at once cannot both win."""
    connection = ExternalConnection.objects.select_for_update().get(pk=connection.pk)
    if connection.state != ConnectionState.REQUESTED:
        raise Conflict(
            f"connection {connection.name} is {connection.state} already",
            code="invalid_state",
            details={"state": [connection.state]},
        )
    connection.state = ConnectionState.APPROVED if approve else ConnectionState.REJECTED
    connection.review_note = note
    connection.reviewed_by = actor if getattr(actor, "is_authenticated", False) else None
    connection.reviewed_at = timezone.now()
    if approve and connection.kind == ConnectionKind.L3_ROUTE:
        router_ensure(connection.project)
    if approve and connection.kind == ConnectionKind.L2VPN:
        from network.desired import gateway_host

        gateway = gateway_host()
        if gateway is None or not gateway.trunk_device:
            raise Conflict(
                "no gateway host reports a trunk device to carry the VLAN; configure "
                "KUMO_NETWORK_TRUNK_DEVICE on the gateway's agent first",
                code="unavailable",
                details={"vlan_id": ["no trunk on the gateway"]},
            )
    try:
        with transaction.atomic():
            connection.save()
    except IntegrityError as e:  # unique_approved_l2vpn_vlan
        raise Conflict(
            f"VLAN {connection.vlan_id} carries another approved L2VPN",
            code="in_use",
            details={"vlan_id": ["in use"]},
        ) from e
    audit.record(
        f"external_connection.{'approve' if approve else 'reject'}",
        connection,
        project=connection.project,
        detail={"note": note},
    )
    if approve:
        _hosts_changed(project=connection.project)
    return connection


@transaction.atomic
def connection_delete(*, connection: ExternalConnection) -> None:
    audit.record("external_connection.delete", connection, project=connection.project)
    was_live = connection.state == ConnectionState.APPROVED
    project = connection.project
    connection.delete()
    if was_live:
        _hosts_changed(project=project)


# --- what host agents report ------------------------------------------------------------------


def host_network_reported(*, host: str, payload: dict, sent_at) -> None:
    """An agent's network report: its underlay, capabilities, and the generation it last
    applied (with the error, when the apply failed). A host behind what it should hold is
    sent its desired state again."""
    with transaction.atomic():
        target = Host.objects.filter(name=host).first()
        if target is None:
            log.info("network report from unknown host %s; it enrolls by heartbeat", host)
            return
        row, _ = HostNetwork.objects.select_for_update().get_or_create(host=target)
        if row.reported_at is not None and sent_at <= row.reported_at:
            return  # older than the report recorded: it says nothing new
        fields = {
            "vtep_address": payload.get("vtep") or None,
            "underlay_device": payload.get("underlay_device", ""),
            "underlay_mtu": int(payload.get("underlay_mtu") or 1500),
            "gateway": bool(payload.get("gateway")),
            "external_bridge": payload.get("external_bridge", ""),
            "trunk_device": payload.get("trunk_device", ""),
            "sriov_pfs": payload.get("sriov_pfs") or {},
            "reported_at": sent_at,
        }
        # The agent's word is the truth: one that restarted has applied nothing yet and
        # says 0, which makes the controller send it everything again.
        applied = int(payload.get("applied_generation") or 0)
        if applied != row.applied_generation:
            fields["applied_generation"] = applied
            fields["applied_at"] = timezone.now()
        fields["last_error"] = "" if payload.get("ok", True) else str(payload.get("error"))[:500]
        gateway_changed = fields["gateway"] != row.gateway
        for name, value in fields.items():
            setattr(row, name, value)
        row.save()
        if gateway_changed:
            _hosts_changed(project=None)
        # A report taken before the host's desired state last changed is behind by
        # construction: that change sent the new state itself, so nothing is sent again.
        behind = not row.converged and (row.desired_at is None or sent_at >= row.desired_at)
    if behind:
        from network import sync

        sync.send_desired([target.pk])
