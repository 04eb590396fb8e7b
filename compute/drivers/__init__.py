"""Host-side hypervisor drivers.

Everything in this package runs inside the host agent, which has no Django: modules here must
not import Django, models or settings. Callers pass frozen dataclasses from ``base`` in and get
frozen dataclasses back.
"""

from compute.drivers.base import (
    DeviceKind,
    DiskSpec,
    DriverError,
    GuestNotFound,
    GuestSpec,
    GuestState,
    HostInventory,
    HypervisorDriver,
    NumaCell,
    PassthroughDevice,
    PciAddress,
    PciDevice,
    PowerState,
)

__all__ = [
    "DeviceKind",
    "DiskSpec",
    "DriverError",
    "GuestNotFound",
    "GuestSpec",
    "GuestState",
    "HostInventory",
    "HypervisorDriver",
    "NumaCell",
    "PassthroughDevice",
    "PciAddress",
    "PciDevice",
    "PowerState",
]
