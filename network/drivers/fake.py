"""A network driver that keeps a host's devices in memory: for tests of what the agent and
the controller do around the host (reports, generations, failures) without root or
namespaces. It honours ``network.drivers.base.NetworkDriver``'s contract, checked by the
same suite as the Linux driver (``tests/network/test_driver_contract.py``): the same device
names, no write when converged, changes in place, and refusals before any write.

``host_devices`` are the devices the host has that Kumo does not make (the underlay, the
trunk, physical functions with their VF counts in ``sriov_pfs``)."""

from __future__ import annotations

from network.drivers.base import (
    VLAN_PREFIX,
    HostNetworks,
    NetworkDriver,
    NetworkDriverError,
    ResyncResult,
    bridge_name,
    dns_netns,
    router_netns,
    vxlan_name,
)


class FakeNetworkDriver(NetworkDriver):
    def __init__(
        self, *, host_devices: tuple[str, ...] = (), sriov_pfs: dict[str, int] | None = None
    ) -> None:
        self.host_devices = set(host_devices)
        self.sriov_pfs = dict(sriov_pfs or {})
        #: Kumo's devices and namespaces on the host: name -> its settings
        self.devices: dict[str, tuple] = {}
        self.closed = False

    def capabilities(self) -> dict:
        return {"sriov_pfs": dict(self.sriov_pfs)}

    def close(self) -> None:
        self.closed = True

    def resync(self, desired: HostNetworks) -> ResyncResult:
        self._refuse_missing(desired)
        wanted = self._wanted(desired)
        result = ResyncResult()
        for name in sorted(self.devices.keys() - wanted.keys()):
            del self.devices[name]
            result.removed.append(name)
        for name, settings in sorted(wanted.items()):
            if name not in self.devices:
                result.created.append(name)
            if self.devices.get(name) != settings:
                self.devices[name] = settings
                result.writes += 1
        result.writes += len(result.removed)
        return result

    def _refuse_missing(self, desired: HostNetworks) -> None:
        for role, name in (("underlay", desired.underlay_device), ("trunk", desired.trunk_device)):
            if name and name not in self.host_devices:
                raise NetworkDriverError(f"{role} device {name} is missing")
        for port in desired.ports:
            if port.kind == "vf" and port.vf_index >= self.sriov_pfs.get(port.pf, 0):
                raise NetworkDriverError(f"{port.pf} has no VF {port.vf_index}")

    @staticmethod
    def _wanted(desired: HostNetworks) -> dict[str, tuple]:
        wanted: dict[str, tuple] = {}
        for net in desired.networks:
            wanted[vxlan_name(net.vni)] = (net.mtu, net.local_vtep, net.fdb)
            wanted[bridge_name(net.vni)] = (net.mtu,)
            if net.l2vpn_vlan:
                wanted[f"{VLAN_PREFIX}{net.vni}"] = (net.l2vpn_vlan,)
        mtus = {net.vni: net.mtu for net in desired.networks}
        for port in desired.ports:
            if port.kind == "vf":
                continue  # the VF is the NIC's: its settings change, no device is made
            wanted[port.name] = (
                port.kind, port.mac, mtus[port.vni], bridge_name(port.vni), port.ips,
                port.firewall, port.peer_netns,
            )  # fmt: skip
        for router in desired.routers:
            wanted[router_netns(router.router_id)] = (router,)
        for service in desired.dns:
            if not service.router_id:
                wanted[dns_netns(service.network_id)] = (service,)
        return wanted
