"""The wire between the controller and the compute side of host agents.

Django-free: both sides import it, and nothing else of each other. Task names, report kinds
and the JSON shape of a guest's desired state live here, once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from compute.drivers.base import HostInventory

# Commands, on the host's own queue.
VM_APPLY_TASK = "kumo.host.compute.vm_apply"
VM_DESCRIBE_TASK = "kumo.host.compute.vm_describe"
VM_CONSOLE_LOG_TASK = "kumo.host.compute.vm_console_log"
CONSOLE_LOG_MAX_BYTES = 65536  # what the console log keeps and answers, as Nova's
GUESTS_LIST_TASK = "kumo.host.compute.guests_list"

# The controller's own task that places waiting VMs (beat's, and a release's: ``compute.tasks``).
SCHEDULE_PENDING_TASK = "kumo.control.vms_schedule_pending"

# Reports, to the controller's queue.
INVENTORY_REPORT = "compute.inventory"
GUESTS_REPORT = "compute.guests"
VM_OBSERVED_REPORT = "compute.vm_observed"

ABSENT = "absent"  # the power state of a guest the host does not have


@dataclass(frozen=True)
class DeviceWire:
    address: str
    kind: str
    numa_node: int | None = None
    class_code: int = 0
    vendor_id: int = 0
    product_id: int = 0


@dataclass(frozen=True)
class InterfaceWire:
    """One NIC of a guest, as the network side made its port.

    ``kind`` ``tap``: a virtio NIC on the host's tap device ``device`` (the network agent
    makes it and puts it on its network's bridge). ``kind`` ``vf``: an RDMA NIC's virtual
    function passed through at ``pci_address`` (it also appears in ``VmApply.devices``).
    ``addresses`` are the guest's static addresses with their prefix length
    (``192.168.10.11/24``), written into the guest's cloud-init network configuration
    with ``gateway`` (empty: none), ``dns`` servers and ``search`` domains.
    """

    port_id: str
    mac: str
    mtu: int
    kind: str = "tap"
    device: str = ""
    pci_address: str = ""
    addresses: tuple[str, ...] = ()
    gateway: str = ""
    dns: tuple[str, ...] = ()
    search: tuple[str, ...] = ()


@dataclass(frozen=True)
class VolumeWire:
    """A storage volume attached to the guest as ``device``: volume ``name`` of at least
    ``size_gib`` in the host's pool ``pool`` (the agent makes or grows it before defining
    the guest; ``storage.host_tasks.prepare_volumes``)."""

    volume_id: str
    pool: str
    name: str
    size_gib: int
    device: str
    serial: str = ""


@dataclass(frozen=True)
class MountWire:
    """A shared file system the guest mounts at boot (cloud-init ``mounts``)."""

    source: str
    mount_point: str
    fstype: str
    options: str = "defaults,_netdev,nofail"


@dataclass(frozen=True)
class VmApply:
    """What the controller wants of one guest at one generation.

    ``desired`` is running, stopped or absent. ``reboot`` asks for one power cycle, done
    only by the call that first applies this generation, so a repeated message never reboots
    twice. ``reset`` asks, the same way, for one hard reset (``virDomainReset``).
    ``graceful_timeout_s`` 0 forces a stop at once (the power-off action). ``expires_at``
    (seconds since the epoch, 0: never) is when the host stops acting on it: a message the
    broker delivers late is dropped, and the reconcile sends what is still wanted afresh. A
    host never acts on a generation older than the one it
    last applied or removed (``compute.drivers.applied``).

    The image: ``image_url`` (a presigned or signed URL, or ``file://``), with
    ``image_checksum`` (``sha256:<hex>``) and ``image_size``, is what the host fetches into its
    image cache (``compute.drivers.imagecache``) and verifies; ``image_url`` empty means the
    image is pre-staged on every host at ``image_location``.
    """

    vm_id: str
    generation: int
    desired: str
    name: str = ""
    hostname: str = ""
    vcpus: int = 1
    memory_mib: int = 1
    numa_cell: int | None = None
    devices: tuple[DeviceWire, ...] = ()
    image_location: str = ""
    image_format: str = "qcow2"
    image_url: str = ""
    image_checksum: str = ""
    image_size: int = 0
    disk_gib: int = 0
    ssh_keys: tuple[str, ...] = ()
    user_data: str = ""
    reboot: bool = False
    reset: bool = False
    graceful_timeout_s: float = 60.0
    operation_id: str = ""
    interfaces: tuple[InterfaceWire, ...] = ()
    volumes: tuple[VolumeWire, ...] = ()
    mounts: tuple[MountWire, ...] = ()
    extra: dict = field(default_factory=dict)
    expires_at: float = 0.0

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict) -> VmApply:
        data = dict(data)
        data["devices"] = tuple(DeviceWire(**d) for d in data.get("devices", ()))
        data["ssh_keys"] = tuple(data.get("ssh_keys", ()))
        data["interfaces"] = tuple(
            InterfaceWire(
                **{
                    **i,
                    "addresses": tuple(i.get("addresses", ())),
                    "dns": tuple(i.get("dns", ())),
                    "search": tuple(i.get("search", ())),
                }
            )
            for i in data.get("interfaces", ())
        )
        data["volumes"] = tuple(VolumeWire(**v) for v in data.get("volumes", ()))
        data["mounts"] = tuple(MountWire(**m) for m in data.get("mounts", ()))
        return cls(**data)


def inventory_payload(inventory: HostInventory) -> dict:
    """The JSON form of a host's inventory (``compute.services.inventory_reported`` reads it)."""
    payload = asdict(inventory)
    payload["cells"] = [
        {"id": c.id, "cpus": list(c.cpus), "memory_mib": c.memory_mib} for c in inventory.cells
    ]
    payload["devices"] = [
        {
            **asdict(d),
            "address": str(d.address),
            "kind": d.kind.value,
            "physical_function": str(d.physical_function) if d.physical_function else "",
        }
        for d in inventory.devices
    ]
    return payload
