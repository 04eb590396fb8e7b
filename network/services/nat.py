"""Routers, global IPs and NAT: global IP pools, a project's router with its own external
address, global addresses (billed while held) and their 1:1 NAT, and port forwards.
"""

import ipaddress

from django.db import transaction
from django.utils import timezone

from controlplane import audit
from controlplane.errors import Conflict, InvalidInput
from network import allocation
from network.models import GlobalIp, GlobalIpPool, Port, PortForward, Router
from network.services._common import _address_in, _hosts_changed, _parse_cidr
from tenants import quotas, usage
from tenants.choices import UsageResource
from tenants.models import Project


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
