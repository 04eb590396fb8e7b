"""The network side of the host agent: converge the host to the desired state the
controller sends, and report what was applied.

No Django here. The controller always sends a host's whole desired state with its
generation; a message older than the one applied changes nothing, and any other is one
idempotent ``resync``. The last desired state is kept in memory and resynced again at
every report, which puts right whatever changed behind the agent's back. An agent that
restarts reports generation 0, and the controller sends it everything again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

from celery import shared_task

from controlplane.agent import reports, runtime
from network import protocol
from network.drivers.base import HostNetworks, NetworkDriverError

log = logging.getLogger(__name__)

_lock = threading.Lock()
_driver = None
_applied = {"generation": 0, "desired": None, "error": ""}


def driver():
    global _driver
    if _driver is None:
        from network.drivers.linux import LinuxNetworkDriver

        config = runtime.config()
        # The networks' resolvers (dnsmasq) keep their files here and outlive the agent.
        _driver = LinuxNetworkDriver(
            config.network_netns, dns_dir=config.var_dir / "dns" / config.host
        )
    return _driver


def exclusive() -> threading.Lock:
    """The lock every convergence of this host's network holds. The compute side holds it
    while it changes devices behind the network side's back (a real guest's tap moved into
    this host's namespace), so a resync never sees half of that."""
    return _lock


def enabled() -> bool:
    return bool(runtime.config().network_vtep)


def _pf_netdev(pf: str) -> str:
    """A VF port names its physical function by PCI address (the inventory's word); the
    kernel wants the PF's netdev, read from sysfs."""
    if ":" not in pf:
        return pf
    found = sorted(p.name for p in Path(f"/sys/bus/pci/devices/{pf}/net").glob("*"))
    if not found:
        raise NetworkDriverError(f"PCI function {pf} has no network device on this host")
    return found[0]


def _resolved(state: HostNetworks) -> HostNetworks:
    ports = tuple(replace(p, pf=_pf_netdev(p.pf)) if p.kind == "vf" else p for p in state.ports)
    return replace(state, ports=ports)


def _resync(state: HostNetworks, generation: int) -> None:
    try:
        result = driver().resync(_resolved(state))
    except (NetworkDriverError, OSError, ValueError) as e:
        log.warning("network generation %d not applied: %s", generation, e)
        _applied["error"] = str(e)
        return
    _applied.update(generation=generation, desired=state, error="")
    if result.writes:
        log.info("network generation %d applied with %d writes", generation, result.writes)


@shared_task(name=protocol.NETWORK_APPLY_TASK, acks_late=True, time_limit=300, ignore_result=True)
def network_apply(*, generation: int, desired: dict) -> None:
    """Converge this host to ``desired`` (generation ``generation``), then report."""
    if not enabled():
        log.warning("network state generation %d ignored: KUMO_NETWORK_VTEP is not set", generation)
        return
    with _lock:
        current = _applied["generation"]
        if generation < current:
            log.info(
                "network generation %d is stale: %d applied", generation, _applied["generation"]
            )
        else:
            try:
                state = protocol.from_wire(desired)
            except (TypeError, ValueError) as e:
                _applied["error"] = f"invalid desired state: {e}"
            else:
                _resync(state, generation)
    network_report(resync=False)


def report_payload() -> dict:
    config = runtime.config()
    try:
        sriov = driver().capabilities().get("sriov_pfs", {})
    except (NetworkDriverError, OSError) as e:
        log.warning("SR-IOV capabilities not read: %s", e)
        sriov = {}
    return {
        "vtep": config.network_vtep,
        "underlay_device": config.network_underlay_device,
        "underlay_mtu": config.network_underlay_mtu,
        "gateway": config.network_gateway,
        "external_bridge": config.network_external_bridge,
        "trunk_device": config.network_trunk_device,
        "sriov_pfs": sriov,
        "applied_generation": _applied["generation"],
        "ok": not _applied["error"],
        "error": _applied["error"],
    }


def network_report(resync: bool = True) -> None:
    """Resync the last desired state (drift made behind the agent's back is put right),
    then tell the controller what this host applied. Without ``KUMO_NETWORK_VTEP`` the
    host does no tenant networking and sends nothing."""
    if not enabled():
        return
    with _lock:
        if resync and _applied["desired"] is not None:
            _resync(_applied["desired"], _applied["generation"])
        taken_at = reports.now()
        payload = report_payload()
    reports.send(runtime.config().host, protocol.NETWORK_APPLIED_REPORT, payload, taken_at=taken_at)
