"""What placement and VM creation ask of leases (reads only; the writes are
``compute.services.leases``)."""

from compute.choices import LeaseState, Priority
from compute.models import Lease, VirtualMachine
from controlplane.errors import InvalidInput

# Leases that count against the fleet (admitted and not over).
HOLDING = [LeaseState.SCHEDULED, LeaseState.PREPARING, LeaseState.ACTIVE]


def placement_refusal(vm: VirtualMachine) -> str:
    """Why ``vm`` (in a lease) cannot be placed now; empty when its lease is active."""
    lease = Lease.objects.get(pk=vm.lease_id)  # as it is now, not as the VM was loaded
    if lease.state in (LeaseState.SCHEDULED, LeaseState.PREPARING):
        return waiting_for(lease)
    if lease.state != LeaseState.ACTIVE:
        return f"its lease {lease.name} is {lease.state}"
    return ""


def waiting_for(lease: Lease) -> str:
    """The reason of a VM that waits for ``lease`` to start."""
    return f"waits for its lease {lease.name} to start at {lease.starts_at.isoformat()}"


def check_vm_lease(*, project, lease: Lease | None, template, priority: str) -> None:
    """Whether a VM of ``template`` may be created in ``lease`` (400 naming ``lease``)."""
    if lease is None:
        return
    if lease.project_id != project.pk:
        raise InvalidInput.field("lease", "no such lease in this project")
    lease.refresh_from_db(fields=["state"])
    if lease.state not in HOLDING:
        raise InvalidInput.field("lease", f"lease {lease.name} is {lease.state}")
    if priority != Priority.ON_DEMAND:
        raise InvalidInput.field("lease", "a VM in a lease is on demand, not spot")
    if not template.gpus:
        raise InvalidInput.field("lease", "a lease holds GPUs: choose a GPU template")
    if template.gpu_model != lease.gpu_model:
        raise InvalidInput.field(
            "lease", f"lease {lease.name} holds {lease.gpu_model}, not {template.gpu_model}"
        )
    if template.gpus > lease.gpus:
        raise InvalidInput.field("lease", f"lease {lease.name} holds only {lease.gpus} GPUs")
