"""Ports: a MAC and an address each, bound to a VM's host (an RDMA port takes one of the
host's virtual functions) or to a namespace on a host; a VM's ports go with the VM.
"""

import ipaddress
from uuid import UUID

from django.db import transaction

from compute import placement
from compute.models import Host, VirtualMachine
from controlplane import audit
from controlplane.compiled import Compiled, prefetched
from controlplane.errors import Conflict, InvalidInput
from network import allocation
from network.choices import NetworkKind, PortBinding
from network.models import (
    FixedIp,
    GlobalIp,
    HostNetwork,
    Network,
    Port,
    PortForward,
    SecurityGroup,
    Subnet,
)
from network.services._common import _hosts_changed, _require_rdma_capable
from network.services.security_groups import default_security_group
from tenants.models import Project


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


# A VM's ports, as every placement and every delete reads them: compiled once.
_VM_PORTS = Compiled(lambda vm_id: Port.objects.filter(vm_id=vm_id), UUID)


def ports_bind(vm: VirtualMachine) -> None:
    """Bind ``vm``'s ports to the host it was just placed on (inside the placing
    transaction). They are left as ``vm.ports`` holds them prefetched, so the message to its
    host that follows the placement knows a VM without ports from them
    (``network.selectors.vm_interfaces``). Ports held prefetched already (a VM made in this
    transaction without NICs has none: ``compute.services.vms.vm_create``) are not read
    again."""
    held = getattr(vm, "_prefetched_objects_cache", {}).get("ports")
    ports = list(held) if held is not None else _VM_PORTS.objects(vm.pk)
    prefetched(vm, "ports", ports)
    for port in ports:
        port.host_id = vm.host_id
        _bind(port)
    if ports:
        _hosts_changed(project=vm.project, host_ids=[vm.host_id])


def ports_unbind(vm: VirtualMachine) -> None:
    """``vm`` left its host holding nothing there (evicted, shelved): its ports leave that
    host. Its RDMA ports give back their VFs, for any VM; the host drops the VM's
    firewall and, if no other port needs them, the VM's networks; the other hosts stop
    sending the VM's MACs to it; the ports read down. Placed again, they bind where it
    goes (``ports_bind``). Inside the transaction that releases it."""
    bound = Port.objects.filter(vm=vm, host__isnull=False)
    hosts = set(bound.values_list("host_id", flat=True))
    if not hosts:
        return
    bound.update(host=None, vf=None, bound_generation=0)
    _hosts_changed(project=vm.project, host_ids=hosts)


def ports_release(vm: VirtualMachine) -> int:
    """Delete ``vm``'s ports, and with them their addresses, 1:1 NAT and port forwards,
    so nothing reaches whoever gets the address next. Returns how many were deleted."""
    ports = _VM_PORTS.objects(vm.pk)
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
    if port.vf_id is not None and port.vm_id is None:  # its VF is free for the scheduler
        placement.vfs_changed(port.host_id)
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
