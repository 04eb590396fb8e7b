"""Reads of network objects that more than one caller needs."""

from uuid import UUID

from compute.protocol import InterfaceWire
from controlplane.compiled import Compiled
from network import dns
from network.choices import PortBinding, PortStatus
from network.drivers.base import port_name
from network.models import FixedIp, HostNetwork, Port

# Every message to a host about a guest reads its ports: compiled once
# (``controlplane.compiled``), not built and compiled by the ORM for each message.
_PORTS = Compiled(
    lambda vm_id: (
        Port.objects.filter(vm_id=vm_id)
        .select_related("network", "vf", "project")
        .order_by("device_index")
    ),
    UUID,
)


def vm_interfaces(vm) -> tuple[InterfaceWire, ...]:
    """A VM's NICs in order, with the static addresses its guest configures (the first
    subnet with a gateway gives the default route) and the resolvers and search domains of
    its subnets (``network.dns.guest_dns``: by default the network's own resolver). A VM
    whose ports were read with it (prefetched) and that has none is answered without a
    read."""
    prefetched = getattr(vm, "_prefetched_objects_cache", {}).get("ports")
    if prefetched is not None and not prefetched:
        return ()
    ports = _PORTS.objects(vm.pk)
    if not ports:
        return ()
    addresses = {}
    for ip in FixedIp.objects.filter(port__in=ports).select_related("subnet").order_by("address"):
        addresses.setdefault(ip.port_id, []).append(ip)
    nics = []
    gateway_taken = False
    for port in ports:
        ips = addresses.get(port.pk, [])
        gateway = ""
        if not gateway_taken:
            gateway = next((ip.subnet.gateway_ip for ip in ips if ip.subnet.gateway_ip), "")
            gateway_taken = bool(gateway)
        told = [dns.guest_dns(ip.subnet, port.network, port.project.slug) for ip in ips]
        nics.append(
            InterfaceWire(
                port_id=port.pk.hex,
                mac=port.mac,
                mtu=port.network.mtu,
                kind="vf" if port.binding == PortBinding.VF else "tap",
                device=port_name(port.pk.hex) if port.binding != PortBinding.VF else "",
                pci_address=port.vf.pci_address if port.vf_id else "",
                addresses=tuple(f"{ip.address}/{ip.subnet.cidr.split('/')[1]}" for ip in ips),
                gateway=gateway or "",
                dns=tuple(dict.fromkeys(s for servers, _ in told for s in servers)),
                search=tuple(dict.fromkeys(d for _, search in told for d in search)),
            )
        )
    return tuple(nics)


def port_statuses(ports) -> dict:
    """Each port's status: active once its host reported applied the generation that
    first held it."""
    applied = dict(
        HostNetwork.objects.filter(host_id__in={p.host_id for p in ports if p.host_id}).values_list(
            "host_id", "applied_generation"
        )
    )
    return {
        p.pk: PortStatus.ACTIVE
        if p.host_id and applied.get(p.host_id, 0) >= p.bound_generation > 0
        else PortStatus.DOWN
        for p in ports
    }
