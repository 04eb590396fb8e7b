"""What one host's tenant networking should be, read from the database.

``host_networks(host)`` builds the ``HostNetworks`` value the host's agent converges to:
the networks with a port on the host (and, on the gateway host, every network a project
router has a leg on, and L2VPN VLANs), their remote VTEPs and MACs, the ports with their
security groups resolved to firewall rules, and on the gateway host the project routers
with their NAT. It reads a fixed number of queries whatever the size of the fleet.
"""

import hashlib
from collections import defaultdict

from network import dns
from network.choices import ConnectionKind, ConnectionState, Direction, NetworkKind, PortBinding
from network.drivers.base import (
    FirewallRule,
    HostNetworks,
    Network,
    Port,
    PortForward,
    Router,
    RouterInterface,
)
from network.models import (
    ExternalConnection,
    FixedIp,
    GlobalIp,
    HostNetwork,
    SecurityGroupRule,
    Subnet,
)
from network.models import Network as NetworkModel
from network.models import (
    Port as PortModel,
)
from network.models import (
    PortForward as PortForwardModel,
)
from network.models import (
    Router as RouterModel,
)

ANY = "0.0.0.0/0"


def router_mac(router_id: str, vni: int) -> str:
    """A router leg's MAC: derived from the router and the network, so it never changes
    and needs no allocation (locally administered, prefix 02:4b:52)."""
    digest = hashlib.sha256(f"{router_id}:{vni}".encode()).digest()
    return "02:4b:52:" + ":".join(f"{b:02x}" for b in digest[:3])


def gateway_host() -> HostNetwork | None:
    """The host that runs project routers: the first gateway by name whose agent has an
    underlay address (active/standby gateways are not built)."""
    return (
        HostNetwork.objects.filter(gateway=True, vtep_address__isnull=False)
        .select_related("host")
        .order_by("host__name")
        .first()
    )


def _router_plan(gateway: HostNetwork | None):
    """Routers and their legs: {router: [subnets it serves]}, for every project that has
    a router. A router joins each of its project's networks whose subnet has a gateway."""
    if gateway is None:
        return {}
    routers = {r.project_id: r for r in RouterModel.objects.all()}
    legs = defaultdict(list)
    subnets = Subnet.objects.filter(
        project_id__in=routers, gateway_ip__isnull=False
    ).select_related("network")
    for subnet in subnets.order_by("network__vni", "cidr"):
        legs[routers[subnet.project_id]].append(subnet)
    return {router: legs[router] for router in routers.values()}


def _resolved_subnets(**where):
    """Subnets with a resolver (overlay, with a gateway), network and project loaded."""
    return (
        Subnet.objects.filter(gateway_ip__isnull=False, network__kind=NetworkKind.OVERLAY, **where)
        .select_related("network", "network__project")
        .order_by("network__vni", "cidr")
    )


def _dns_services(plan, subnets) -> tuple:
    """The resolvers of ``subnets``' networks (gateway host only)."""
    if not subnets:
        return ()
    projects = {s.project_id for s in subnets}
    records = FixedIp.objects.filter(port__project_id__in=projects).values_list(
        "port__project_id", "port__network_id", "address", "port__vm__name", "port__name"
    )
    routers = {router.project_id: router.pk.hex for router in plan}
    return dns.services(subnets, routers, records.order_by("address"))


def _addresses_by_port(port_ids) -> dict:
    found = defaultdict(list)
    for port_id, address in (
        FixedIp.objects.filter(port_id__in=port_ids)
        .order_by("address")
        .values_list("port_id", "address")
    ):
        found[port_id].append(address)
    return found


def _firewalls(ports: list[PortModel]) -> dict:
    """Each filtered port's rules, the union of its groups' rules; a remote group becomes
    one rule per address of that group's ports."""
    filtered = [p for p in ports if p.port_security]
    if not filtered:
        return {}
    groups_of = defaultdict(set)
    through = PortModel.security_groups.through
    for port_id, group_id in through.objects.filter(
        port_id__in=[p.pk for p in filtered]
    ).values_list("port_id", "securitygroup_id"):
        groups_of[port_id].add(group_id)
    group_ids = set().union(*groups_of.values()) if groups_of else set()
    rules = list(SecurityGroupRule.objects.filter(group_id__in=group_ids))
    remote_ids = {r.remote_group_id for r in rules if r.remote_group_id}
    members = defaultdict(set)
    for group_id, address in through.objects.filter(securitygroup_id__in=remote_ids).values_list(
        "securitygroup_id", "port__fixed_ips__address"
    ):
        if address:
            members[group_id].add(address)
    by_group = defaultdict(list)
    for rule in rules:
        by_group[rule.group_id].append(rule)
    result = {}
    for port in filtered:
        compiled = set()
        for group_id in groups_of.get(port.pk, ()):
            for rule in by_group[group_id]:
                if rule.remote_group_id:
                    remotes = [f"{a}/32" for a in sorted(members[rule.remote_group_id])]
                else:
                    remotes = [rule.remote_cidr or ANY]
                for remote in remotes:
                    compiled.add(
                        FirewallRule(
                            direction=rule.direction,
                            protocol=rule.protocol,
                            port_min=rule.port_min or 0,
                            port_max=rule.port_max or 0,
                            remote_cidr=remote,
                        )
                    )
        result[port.pk] = tuple(
            sorted(compiled, key=lambda r: (r.direction != Direction.INGRESS, repr(r)))
        )
    return result


def _routers(plan) -> tuple[Router, ...]:
    if not plan:
        return ()
    project_ids = [r.project_id for r in plan]
    own = {
        g.project_id: g
        for g in GlobalIp.objects.filter(project_id__in=project_ids, router=True).select_related(
            "pool"
        )
    }
    floating = defaultdict(list)
    for gip in GlobalIp.objects.filter(project_id__in=project_ids, port__isnull=False):
        floating[gip.project_id].append(gip)
    forwards = defaultdict(list)
    for fwd in PortForwardModel.objects.filter(project_id__in=project_ids).select_related(
        "global_ip"
    ):
        forwards[fwd.project_id].append(fwd)
    nat_ports = {g.port_id for gs in floating.values() for g in gs} | {
        f.port_id for fs in forwards.values() for f in fs
    }
    first_address = {k: v[0] for k, v in _addresses_by_port(nat_ports).items() if v}
    routes = defaultdict(list)
    for conn in ExternalConnection.objects.filter(
        project_id__in=project_ids, kind=ConnectionKind.L3_ROUTE, state=ConnectionState.APPROVED
    ):
        routes[conn.project_id].append((conn.destination_cidr, conn.next_hop))
    external_nets = set(
        NetworkModel.objects.filter(project_id__in=project_ids, external_access=True).values_list(
            "pk", flat=True
        )
    )
    routers = []
    for router, subnets in sorted(plan.items(), key=lambda item: str(item[0].pk)):
        rid = router.pk.hex
        external = own.get(router.project_id)
        routers.append(
            Router(
                router_id=rid,
                interfaces=tuple(
                    RouterInterface(
                        vni=s.network.vni,
                        address=f"{s.gateway_ip}/{s.cidr.split('/')[1]}",
                        mac=router_mac(rid, s.network.vni),
                    )
                    for s in subnets
                ),
                external_address=(
                    f"{external.address}/{external.pool.cidr.split('/')[1]}" if external else ""
                ),
                external_gateway=external.pool.gateway_ip if external else "",
                snat_cidrs=tuple(
                    sorted({s.cidr for s in subnets if s.network_id in external_nets})
                ),
                floating=tuple(
                    sorted(
                        (g.address, first_address[g.port_id])
                        for g in floating[router.project_id]
                        if g.port_id in first_address
                    )
                ),
                forwards=tuple(
                    sorted(
                        (
                            PortForward(
                                global_ip=f.global_ip.address,
                                protocol=f.protocol,
                                external_port=f.external_port,
                                internal_ip=first_address[f.port_id],
                                internal_port=f.internal_port,
                            )
                            for f in forwards[router.project_id]
                            if f.port_id in first_address
                        ),
                        key=lambda f: (f.global_ip, f.protocol, f.external_port),
                    )
                ),
                routes=tuple(sorted(routes[router.project_id])),
            )
        )
    return tuple(routers)


def host_networks(host_id: int) -> HostNetworks:
    """The desired state of host ``host_id``'s tenant networking."""
    me = HostNetwork.objects.select_related("host").get(host_id=host_id)
    gateway = gateway_host()
    on_gateway = gateway is not None and gateway.host_id == host_id
    plan = _router_plan(gateway)

    ports_here = list(
        PortModel.objects.filter(host_id=host_id).select_related("network", "vf").order_by("pk")
    )
    vnis_here = {p.network.vni: p.network for p in ports_here if p.binding != PortBinding.VF}
    leg_vnis = {s.network.vni: s.network for subnets in plan.values() for s in subnets}
    vlans = {}
    resolvers = ()
    if on_gateway:
        vnis_here.update(leg_vnis)
        resolved = list(_resolved_subnets())
        resolvers = _dns_services(plan, resolved)
        vnis_here.update({s.network.vni: s.network for s in resolved})
    if on_gateway and me.trunk_device:
        for connection in ExternalConnection.objects.filter(
            kind=ConnectionKind.L2VPN, state=ConnectionState.APPROVED
        ).select_related("network"):
            vlans[connection.network.vni] = connection.vlan_id
            vnis_here.setdefault(connection.network.vni, connection.network)

    # Every bound port on these networks elsewhere: its MAC lives behind its host's VTEP.
    remote_macs = defaultdict(set)
    remote_vteps = defaultdict(set)
    elsewhere = (
        PortModel.objects.filter(network__vni__in=vnis_here, host__isnull=False)
        .exclude(host_id=host_id)
        .exclude(binding=PortBinding.VF)
        .values_list("network__vni", "mac", "host__network__vtep_address")
    )
    for vni, mac, vtep in elsewhere:
        if vtep:
            remote_macs[vni].add((mac, vtep))
            remote_vteps[vni].add(vtep)
    if gateway is not None and not on_gateway:
        for router, subnets in plan.items():
            for s in subnets:
                if s.network.vni in vnis_here:
                    vni = s.network.vni
                    remote_macs[vni].add((router_mac(router.pk.hex, vni), gateway.vtep_address))
                    remote_vteps[vni].add(gateway.vtep_address)
        # A network whose project has no router has its resolver in a namespace of its own
        # on the gateway host, behind that host's VTEP.
        routed = {r.project_id for r in plan}
        for network in {s.network for s in _resolved_subnets(network__vni__in=vnis_here)}:
            if network.project_id not in routed:
                remote_macs[network.vni].add((dns.dns_mac(network.pk.hex), gateway.vtep_address))
                remote_vteps[network.vni].add(gateway.vtep_address)

    local = me.vtep_address or ""
    networks = tuple(
        Network(
            vni=vni,
            mtu=net.mtu,
            local_vtep=local,
            remote_vteps=tuple(sorted(remote_vteps[vni] - {local})),
            remote_macs=tuple(sorted(m for m in remote_macs[vni] if m[1] != local)),
            l2vpn_vlan=vlans.get(vni, 0),
        )
        for vni, net in sorted(vnis_here.items())
    )
    addresses = _addresses_by_port([p.pk for p in ports_here])
    firewalls = _firewalls(ports_here)
    ports = tuple(
        Port(
            port_id=p.pk.hex,
            vni=p.network.vni,
            mac=p.mac,
            kind=p.binding,
            peer_netns=p.binding_netns,
            ips=tuple(addresses.get(p.pk, ())),
            firewall=firewalls.get(p.pk),
            **_vf_fields(p),
        )
        for p in ports_here
    )
    return HostNetworks(
        networks=networks,
        ports=ports,
        underlay_device=me.underlay_device,
        routers=_routers(plan) if on_gateway else (),
        external_bridge=me.external_bridge if on_gateway else "",
        trunk_device=me.trunk_device if on_gateway and vlans else "",
        dns=resolvers,
    )


def _vf_fields(port: PortModel) -> dict:
    """A VF port's physical function and index, from its device's PCI function: the
    agent's SR-IOV report maps PFs to VF counts; the VF index is the device's position
    among the PF's VFs."""
    if port.binding != PortBinding.VF or port.vf is None:
        return {}
    siblings = list(
        port.vf.host.devices.filter(physical_function=port.vf.physical_function)
        .order_by("pci_address")
        .values_list("pk", flat=True)
    )
    return {"pf": port.vf.physical_function, "vf_index": siblings.index(port.vf.pk)}
