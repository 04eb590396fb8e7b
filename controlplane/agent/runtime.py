"""The running agent's state: its configuration, fixed at start, and its one hypervisor
connection, which the compute and storage sides of the agent share."""

import logging
import threading
import time

from controlplane.agent.config import AgentConfig

log = logging.getLogger(__name__)

STARTED = time.monotonic()
_config: AgentConfig | None = None
_hypervisor = None
_hypervisor_lock = threading.Lock()


def configure(config: AgentConfig) -> None:
    global _config
    _config = config


def config() -> AgentConfig:
    if _config is None:
        configure(AgentConfig.from_env())
    return _config


def hypervisor():
    """This agent's one hypervisor connection (libvirt's test driver keeps its guests per
    connection, so a simulated host must never open a second one): a
    ``compute.drivers.libvirt.LibvirtDriver`` on the configured URI and acceleration."""
    global _hypervisor
    with _hypervisor_lock:
        if _hypervisor is None:
            from compute.drivers import accel
            from compute.drivers.libvirt import LibvirtDriver

            settings = config()
            chosen = accel.resolve(settings.guest_accel)
            _hypervisor = LibvirtDriver(
                settings.libvirt_uri,
                cpu_mode=settings.guest_cpu_mode,
                cpu_disable=settings.guest_cpu_disable,
                accel=chosen.accel,
                host=settings.host,
            )
            if not _hypervisor.simulated:
                log.info("guests run on %s (%s)", chosen.accel, chosen.reason)
        return _hypervisor


def close_hypervisor() -> None:
    """Close the hypervisor connection in an orderly way (the agent calls it on shutdown):
    left to the interpreter's exit, libvirt's ``virConnect.__del__`` prints a traceback."""
    global _hypervisor
    with _hypervisor_lock:
        hv, _hypervisor = _hypervisor, None
    if hv is not None:
        hv.close()
