"""Every write to compute's objects, one module per part:

- ``hosts``: heartbeats, liveness, operator labels and states, pings;
- ``catalog``: templates, pre-staged images and placement groups;
- ``images``: images as a service: upload into the image store, import, delete, fetch;
- ``vms``: the VM life cycle (create, start, stop, reboot, delete) and pending placement;
- ``reconcile``: what agents report (inventory, guests, observed state) and the drift work;
- ``spot``: preemption, eviction notices and the hand-over, guaranteed minimums;
- ``reclaim``: reclamation of expired projects', idle and over-budget projects' VMs;
- ``shelve``: shelve (release every claim, keep the root disk) and unshelve;
- ``leases``: reservations of GPUs over a period (admission, preparing, start, end);
- ``consoles``: tokens to a VM's interactive serial console, and their redeeming.
"""

from compute.services.catalog import (
    image_create,
    placement_group_create,
    placement_group_delete,
    template_create,
    template_update,
)
from compute.services.consoles import console_token_issue, console_token_redeem
from compute.services.hosts import (
    PING_TASK,
    host_heartbeat,
    host_heartbeat_reported,
    host_ping,
    host_set_state,
    host_update,
    hosts_check,
)
from compute.services.images import (
    image_delete,
    image_fetch,
    image_import,
    image_register,
    image_upload,
)
from compute.services.leases import lease_cancel, lease_create, lease_update, leases_tick
from compute.services.reclaim import budget_reclaim, reclaim_run, reclamation_report
from compute.services.reconcile import (
    guests_reported,
    host_guests_list,
    inventory_reported,
    vm_describe,
    vm_observed,
    vms_reap_stuck,
)
from compute.services.shelve import vm_shelve, vm_unshelve
from compute.services.spot import (
    checkpoint_report,
    eviction_acknowledge,
    evictions_reap,
    guarantee_set,
    preempt_for,
    vm_start_evicted,
)
from compute.services.vms import (
    vm_console_log,
    vm_create,
    vm_delete,
    vm_power_off,
    vm_reboot,
    vm_reset,
    vm_schedule_pending,
    vm_start,
    vm_stop,
)

__all__ = [
    "PING_TASK",
    "budget_reclaim",
    "checkpoint_report",
    "console_token_issue",
    "console_token_redeem",
    "eviction_acknowledge",
    "evictions_reap",
    "guarantee_set",
    "guests_reported",
    "host_guests_list",
    "host_heartbeat",
    "host_heartbeat_reported",
    "host_ping",
    "host_set_state",
    "host_update",
    "hosts_check",
    "image_create",
    "image_delete",
    "image_fetch",
    "image_import",
    "image_register",
    "image_upload",
    "inventory_reported",
    "lease_cancel",
    "lease_create",
    "lease_update",
    "leases_tick",
    "placement_group_create",
    "placement_group_delete",
    "preempt_for",
    "reclaim_run",
    "reclamation_report",
    "template_create",
    "template_update",
    "vm_console_log",
    "vm_create",
    "vm_delete",
    "vm_describe",
    "vm_observed",
    "vm_power_off",
    "vm_reboot",
    "vm_reset",
    "vm_schedule_pending",
    "vm_shelve",
    "vm_start",
    "vm_start_evicted",
    "vm_stop",
    "vm_unshelve",
    "vms_reap_stuck",
]
