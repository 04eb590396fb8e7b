"""The wire between the controller and the network side of host agents.

Django-free: both sides import it. The controller sends a host's whole desired state
(``network.drivers.base.HostNetworks``) with its generation; the agent converges to it and
reports the generation it applied, so every message is idempotent and a newer one
supersedes every older one.
"""

from __future__ import annotations

from dataclasses import asdict

from network.drivers.base import (
    DnsService,
    FirewallRule,
    HostNetworks,
    Network,
    Port,
    PortForward,
    Router,
    RouterInterface,
)

# Commands, on the host's own queue.
NETWORK_APPLY_TASK = "kumo.host.network.apply"

# Reports, to the controller's queue.
NETWORK_APPLIED_REPORT = "network.applied"  # after every apply and periodically


def to_wire(desired: HostNetworks) -> dict:
    return asdict(desired)


def _tuples(items) -> tuple:
    return tuple(tuple(item) for item in items)


def from_wire(data: dict) -> HostNetworks:
    """The inverse of ``to_wire``; raises ValueError for anything the contract refuses."""
    networks = tuple(
        Network(
            **{
                **n,
                "remote_vteps": tuple(n.get("remote_vteps", ())),
                "remote_macs": _tuples(n.get("remote_macs", ())),
            }
        )
        for n in data.get("networks", ())
    )
    ports = []
    for p in data.get("ports", ()):
        firewall = p.get("firewall")
        ports.append(
            Port(
                **{
                    **p,
                    "ips": tuple(p.get("ips", ())),
                    "firewall": None
                    if firewall is None
                    else tuple(FirewallRule(**rule) for rule in firewall),
                }
            )
        )
    routers = tuple(
        Router(
            **{
                **r,
                "interfaces": tuple(RouterInterface(**i) for i in r.get("interfaces", ())),
                "snat_cidrs": tuple(r.get("snat_cidrs", ())),
                "floating": _tuples(r.get("floating", ())),
                "forwards": tuple(PortForward(**f) for f in r.get("forwards", ())),
                "routes": _tuples(r.get("routes", ())),
            }
        )
        for r in data.get("routers", ())
    )
    dns = tuple(
        DnsService(
            **{
                **d,
                "addresses": tuple(d.get("addresses", ())),
                "hosts": _tuples(d.get("hosts", ())),
                "upstreams": tuple(d.get("upstreams", ())),
            }
        )
        for d in data.get("dns", ())
    )
    return HostNetworks(
        networks=networks,
        ports=tuple(ports),
        underlay_device=data.get("underlay_device", ""),
        routers=routers,
        external_bridge=data.get("external_bridge", ""),
        trunk_device=data.get("trunk_device", ""),
        dns=dns,
    )
