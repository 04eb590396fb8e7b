"""What the portal's pages show beyond plain lists: the month's usage by day, a template's
price per hour, a VM's NCCL topology and the fleet's GPU grid.

Every read here goes through a project-scoped queryset (``Model.objects.for_project``) or,
for the operators' fleet, through the whole fleet; every price comes from billing's own
functions (``tenants.billing``) and every topology from compute's own builder
(``compute.drivers.nccl``), so the portal shows what the API and the bill would say.
"""

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Prefetch

from compute.choices import DeviceKind, HostState, Priority, VmState
from compute.drivers.base import DeviceKind as WireDeviceKind
from compute.drivers.base import GuestSpec, PassthroughDevice, PciAddress
from compute.drivers.domain_xml import guest_pci_layout
from compute.drivers.nccl import topology_xml
from compute.models import Device, Host, Template, VirtualMachine
from controlplane.errors import Conflict
from tenants import billing, usage
from tenants.models import RateCard, UsageRecord

# --- the month, day by day --------------------------------------------------------------------


def month_days(now: datetime) -> list[datetime]:
    """The UTC midnights of the current month from its first day up to today."""
    start, _end = billing.month_bounds(now.astimezone(UTC).date())
    days = []
    day = start
    while day <= now:
        days.append(day)
        day += timedelta(days=1)
    return days


def usage_by_day(project, resource: str, now: datetime) -> list[tuple[datetime, Decimal]]:
    """Unit-hours of ``resource`` (e.g. GPU-hours) per day of the current month up to
    ``now``, from the project's usage intervals (open ones count up to ``now``)."""
    days = month_days(now)
    start = days[0]
    hours: dict[datetime, Decimal] = defaultdict(Decimal)
    records = (
        UsageRecord.objects.for_project(project)
        .filter(resource=resource, started_at__lt=now)
        .exclude(ended_at__lte=start)
        .only("quantity", "started_at", "ended_at")
    )
    for record in records:
        end = min(record.ended_at or now, now)
        for day in days:
            lo, hi = max(record.started_at, day), min(end, day + timedelta(days=1))
            if hi > lo:
                hours[day] += record.quantity * Decimal((hi - lo).total_seconds()) / 3600
    return [(day, hours[day]) for day in days]


def spend_by_day(project, now: datetime) -> list[tuple[datetime, Decimal]]:
    """The rated spend of each day of the current month up to ``now`` (billing's
    ``spend``: usage no rate card covers costs nothing)."""
    return [
        (
            day,
            billing.spend([project.pk], day, min(day + timedelta(days=1), now), open_until=now)[
                project.pk
            ],
        )
        for day in month_days(now)
    ]


# --- prices -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Price:
    per_hour: Decimal
    currency: str


def price_per_hour(template: Template, priority: str, card: RateCard | None) -> Price | None:
    """What one hour of a running VM of ``template`` at ``priority`` costs under ``card``
    (billing's ``rate_card_at``): the usage a running VM opens
    (``tenants.usage.vm_usage_wanted``) priced for 3600 s by billing's own ``price_lines``.
    None without a card, or when the card prices one of its resources not at all."""
    if card is None:
        return None
    running = VirtualMachine(
        state=VmState.RUNNING,
        priority=priority,
        vcpus=template.vcpus,
        memory_mib=template.memory_gib * 1024,
        gpus=template.gpus,
        gpu_model=template.gpu_model,
        disk_gib=template.disk_gib,
    )
    seconds = {
        (resource, model, billed_priority, card.pk): quantity * 3600
        for (resource, model), (quantity, billed_priority) in usage.vm_usage_wanted(running).items()
    }
    try:
        lines = billing.price_lines(seconds, {card.pk: card})
    except Conflict:  # the card has no price for a resource: no honest figure to show
        return None
    return Price(sum((line.amount for line in lines), Decimal("0.00")), card.currency)


# --- a VM's GPUs and NCCL topology ------------------------------------------------------------


def vm_gpus(vm: VirtualMachine) -> list[Device]:
    """The GPUs and RDMA functions ``vm`` holds, by PCI address."""
    return list(Device.objects.filter(vm=vm).order_by("pci_address"))


def _guest_spec(vm: VirtualMachine, devices: list[Device]) -> GuestSpec:
    """The guest as its host builds it, as far as its devices' places go (the same inputs
    ``compute.services.lifecycle.apply_message`` sends)."""
    return GuestSpec(
        vm_id=str(vm.pk),
        generation=vm.generation,
        name=f"{vm.project.slug}/{vm.name}",
        vcpus=vm.vcpus,
        memory_mib=vm.memory_mib,
        numa_cell=vm.numa_cell,
        devices=tuple(
            PassthroughDevice(
                address=PciAddress.parse(d.pci_address),
                kind=WireDeviceKind(d.kind),
                numa_node=d.numa_node,
                class_code=d.class_code,
                vendor_id=d.vendor_id,
                product_id=d.product_id,
            )
            for d in devices
        ),
    )


def nccl_topology(vm: VirtualMachine, devices: list[Device]) -> str | None:
    """The NCCL topology file compute writes into the guest (``compute.drivers.nccl``),
    built from the devices ``vm`` holds now; None for a VM without GPUs."""
    if not any(d.kind == DeviceKind.GPU for d in devices):
        return None
    return topology_xml(_guest_spec(vm, devices))


def guest_pci_addresses(vm: VirtualMachine, devices: list[Device]) -> dict[int, str]:
    """Where each device appears inside the guest (``lspci`` there), by device id: the
    layout the host's domain XML gives it (``compute.drivers.domain_xml``), a pure function
    of the same inputs."""
    if not devices:
        return {}
    inside = {
        slot.host_address: str(slot.guest_address)
        for slot in guest_pci_layout(_guest_spec(vm, devices))
    }
    return {d.pk: inside.get(PciAddress.parse(d.pci_address), "") for d in devices}


# --- the fleet --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuCell:
    device: Device
    occupancy: str  # "free", "on_demand" or "spot"
    vm_name: str
    project: str


@dataclass(frozen=True)
class HostRow:
    host: Host
    gpus: list[GpuCell]

    @property
    def used(self) -> int:
        return sum(1 for cell in self.gpus if cell.occupancy != "free")


def fleet() -> dict[str, list[HostRow]]:
    """Every host grouped by state (up first), each with its GPUs in PCI order and who
    holds each: free, an on-demand VM or a spot VM (``Device.vm`` and the VM's priority).
    Three queries whatever the fleet's size."""
    gpus = Device.objects.filter(kind=DeviceKind.GPU, present=True).select_related("vm__project")
    hosts = Host.objects.order_by("name").prefetch_related(
        Prefetch("devices", queryset=gpus.order_by("pci_address"), to_attr="gpu_devices")
    )
    order = [HostState.UP, HostState.DRAINING, HostState.MAINTENANCE, HostState.DOWN]
    order += [s for s in HostState.values if s not in order]
    groups: dict[str, list[HostRow]] = {state: [] for state in order}
    for host in hosts:
        cells = [
            GpuCell(
                device=d,
                occupancy="free"
                if d.vm is None
                else ("spot" if d.vm.priority == Priority.SPOT else "on_demand"),
                vm_name=d.vm.name if d.vm else "",
                project=d.vm.project.slug if d.vm else "",
            )
            for d in host.gpu_devices
        ]
        groups[host.state].append(HostRow(host=host, gpus=cells))
    return {state: rows for state, rows in groups.items() if rows}
