"""Hosts and their devices, templates, images, placement groups and virtual machines."""

import secrets
import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from compute.choices import (
    DeviceKind,
    EvictAction,
    HostState,
    ImageFormat,
    ImageState,
    LeaseState,
    PlacementPolicy,
    PowerState,
    Priority,
    ReclaimAction,
    ReclaimReason,
    Visibility,
    VmState,
    VmTask,
)
from compute.scheduler import NO_ROOM
from controlplane.validators import hostname_validator
from tenants.models import Project, ProjectOwnedModel


class Host(models.Model):
    """A hypervisor host and its agent, which consumes queue ``host.<name>``.

    A host is created by its agent's first heartbeat (or by an operator ahead of it) and
    marked down when heartbeats stop; it comes back up by itself when they return, unless
    an operator put it in draining or maintenance.

    Capacity comes from the agent's inventory report. ``vcpus_used`` and ``memory_mib_used``
    are the claim counters the scheduler's conditional UPDATE checks and moves in the same
    statement (``compute.placement``); they are never edited by hand, and
    ``compute.selectors.host_usage_drift`` proves them against the VMs placed here.
    """

    name = models.SlugField(max_length=63, unique=True)
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.ENROLLING)
    state_reason = models.CharField(max_length=200, blank=True)
    libvirt_uri = models.CharField(max_length=255, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    agent_started_at = models.DateTimeField(null=True, blank=True)
    capabilities = models.JSONField(default=list, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True, db_index=True)
    rack = models.CharField(max_length=64, blank=True)
    zone = models.CharField(max_length=64, blank=True)
    # Inventory, as the agent last reported it.
    hypervisor = models.CharField(max_length=32, blank=True)
    guest_accel = models.CharField(
        max_length=8, blank=True, help_text="how real guests run: kvm or tcg (QEMU emulation)"
    )
    vcpus = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    numa_cells = models.JSONField(default=list, blank=True, help_text="[{id, cpus, memory_mib}]")
    inventory_reported_at = models.DateTimeField(null=True, blank=True)
    # Overcommit: what the scheduler may hand out is capacity x ratio. GPUs never overcommit.
    cpu_allocation_ratio = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.1), MaxValueValidator(32.0)]
    )
    ram_allocation_ratio = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.1), MaxValueValidator(4.0)]
    )
    vcpus_used = models.PositiveIntegerField(default=0)
    memory_mib_used = models.PositiveBigIntegerField(default=0)
    guests_reported_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(vcpus_used__gte=0) & Q(memory_mib_used__gte=0),
                name="host_usage_not_negative",
            )
        ]

    def __str__(self):
        return self.name

    @property
    def vcpus_capacity(self) -> int:
        return int(self.vcpus * self.cpu_allocation_ratio)

    @property
    def memory_mib_capacity(self) -> int:
        return int(self.memory_mib * self.ram_allocation_ratio)


class Device(models.Model):
    """A host PCI function Kumo hands out whole: a GPU or an RDMA NIC virtual function.

    ``vm`` is the allocation: set by the claim's ``UPDATE … WHERE vm IS NULL``, so a device
    can never be given to two VMs.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=64, help_text="libvirt node-device name")
    pci_address = models.CharField(max_length=12, help_text="e.g. 0000:07:00.0")
    kind = models.CharField(max_length=8, choices=DeviceKind.choices)
    model = models.CharField(max_length=64, blank=True, help_text="e.g. A100-SXM4-40GB")
    vendor_id = models.PositiveIntegerField()
    product_id = models.PositiveIntegerField()
    class_code = models.PositiveIntegerField(default=0)
    vendor_name = models.CharField(max_length=128, blank=True)
    product_name = models.CharField(max_length=128, blank=True)
    numa_node = models.SmallIntegerField(null=True, blank=True)
    iommu_group = models.IntegerField(null=True, blank=True)
    physical_function = models.CharField(max_length=12, blank=True)
    present = models.BooleanField(default=True, help_text="in the host's last inventory")
    vm = models.ForeignKey(
        "VirtualMachine",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="devices",
    )
    lease = models.ForeignKey(
        "Lease",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="devices",
        help_text="the lease holding this GPU now: only that lease's VMs are placed on it",
    )

    class Meta:
        ordering = ["host", "pci_address"]
        constraints = [
            models.UniqueConstraint(fields=["host", "pci_address"], name="unique_host_device")
        ]
        indexes = [models.Index(fields=["host", "kind", "vm"], name="device_host_kind_vm")]

    def __str__(self):
        return f"{self.host.name}:{self.pci_address} ({self.model or self.kind})"


class Template(models.Model):
    """A VM size (mdx calls them packs): vCPUs, memory, GPUs, local disk."""

    name = models.SlugField(max_length=63, unique=True)
    description = models.CharField(max_length=200, blank=True)
    vcpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpus = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(8)])
    gpu_model = models.CharField(max_length=64, blank=True, help_text="e.g. A100-SXM4-40GB")
    disk_gib = models.PositiveIntegerField(default=40)
    spot_allowed = models.BooleanField(default=True)
    eviction_notice_s = models.PositiveIntegerField(
        default=30,
        validators=[MaxValueValidator(3600)],
        help_text="seconds a spot VM of this size runs after its eviction notice",
    )
    evict_action = models.CharField(
        max_length=8,
        choices=EvictAction.choices,
        default=EvictAction.STOP,
        help_text="what an evicted spot VM of this size becomes: evicted, or shelved",
    )
    active = models.BooleanField(default=True, help_text="offered for new VMs")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpus", "vcpus", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpus=0) | ~Q(gpu_model=""), name="template_gpus_have_a_model"
            ),
            models.CheckConstraint(
                condition=Q(gpus__in=[0, 1, 2, 4, 8]), name="template_gpus_1_2_4_or_8"
            ),
        ]

    def __str__(self):
        return self.name


class ImageQuerySet(models.QuerySet):
    def usable_by(self, project):
        """Images ``project`` may boot: public ones and its own."""
        return self.filter(
            Q(visibility=Visibility.PUBLIC) | Q(project=project), state=ImageState.ACTIVE
        )

    def visible_to(self, project):
        """Images ``project`` sees: the public active ones and its own not deleted (an
        upload of its own in progress or failed included)."""
        return self.filter(
            Q(visibility=Visibility.PUBLIC, state=ImageState.ACTIVE)
            | Q(
                project=project,
                state__in=[ImageState.UPLOADING, ImageState.ACTIVE, ImageState.FAILED],
            )
        )


class Image(models.Model):
    """A bootable disk image: public (operators') or one project's own.

    ``location`` is the key of its bytes in the image store (``compute.drivers.imagestore``),
    or, for an image an operator registered by path, an absolute path every host holds
    (pre-staged). ``checksum`` and ``size_bytes`` are what the store computed on upload;
    hosts verify their cached copy against ``checksum`` before every use.
    """

    name = models.CharField(max_length=100)
    description = models.CharField(max_length=200, blank=True)
    os_distro = models.CharField(max_length=32, help_text="e.g. ubuntu")
    os_version = models.CharField(max_length=32, blank=True, help_text="e.g. 24.04")
    format = models.CharField(max_length=8, choices=ImageFormat.choices)
    location = models.CharField(
        max_length=500, blank=True, help_text="the image store's key, or a path on every host"
    )
    checksum = models.CharField(
        max_length=80, blank=True, help_text="sha256:<hex> (while uploading: the one expected)"
    )
    login_user = models.CharField(
        max_length=32, blank=True, help_text="the user a guest of this image is logged into"
    )
    state = models.CharField(
        max_length=12, choices=ImageState.choices, default=ImageState.ACTIVE, db_index=True
    )
    state_reason = models.CharField(max_length=500, blank=True)
    size_bytes = models.PositiveBigIntegerField(default=0)
    min_disk_gib = models.PositiveIntegerField(default=0)
    min_memory_gib = models.PositiveIntegerField(default=0)
    visibility = models.CharField(max_length=8, choices=Visibility.choices)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ImageQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(visibility=Visibility.PUBLIC) & Q(project__isnull=True))
                | (Q(visibility=Visibility.PROJECT) & Q(project__isnull=False)),
                name="image_project_matches_visibility",
            )
        ]

    def __str__(self):
        return self.name


class PlacementGroup(ProjectOwnedModel):
    """VMs placed together (affinity, compact: one rack) or apart (anti-affinity)."""

    name = models.CharField(max_length=63, validators=[hostname_validator])
    policy = models.CharField(max_length=16, choices=PlacementPolicy.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_placement_group")
        ]

    def __str__(self):
        return f"{self.name} ({self.policy})"


def new_metadata_token() -> str:
    """A VM's metadata token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


#: A VM in the scheduling pass's queue: pending, and not waiting for spot evictions (those
#: the hand-over places).
QUEUED = Q(state="pending", reserved_host__isnull=True)
#: A spot VM on its own: in no placement group and no lease (a "plain" one). The pass
#: decides the plain ones a size at a time (``compute.services.vms.vm_schedule_pending``).
PLAIN_SPOT = Q(priority="spot", placement_group__isnull=True, lease__isnull=True)
#: What a VM's size is to the scheduler.
SIZE = ("gpus", "vcpus", "memory_mib", "gpu_model", "rdma_vfs")
#: A waiting VM not yet told that it waits for want of room for its size: its reason does
#: not start with ``NO_ROOM``. Written as the range of the strings that start with it (in
#: byte order, SQLite's and that of PostgreSQL's C collations) rather than as a ``LIKE``:
#: SQLite matches a partial index's condition to a range of bound values, not to a ``LIKE``.
UNTOLD = ~Q(state_reason__gte=NO_ROOM, state_reason__lt=NO_ROOM[:-1] + chr(ord(NO_ROOM[-1]) + 1))


class VirtualMachine(ProjectOwnedModel):
    """A tenant's VM. Three separate fields say where it is, as Nova keeps them apart:

    - ``state``: its life in the control plane (``VmState``);
    - ``task_state``: the action in flight on a settled VM (``VmTask``);
    - ``power_state``: what its host last observed (``PowerState``).

    ``generation`` counts the changes asked of it. Every change is a conditional UPDATE on
    the generation it read, and every host task carries the generation it applies, which
    the host records in the domain's metadata: a repeated or stale task changes nothing.
    Sizes are copied from the template at create, so editing a template changes no VM.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63, validators=[hostname_validator])
    template = models.ForeignKey(Template, on_delete=models.PROTECT, related_name="+")
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="+")
    priority = models.CharField(max_length=16, choices=Priority.choices, default=Priority.ON_DEMAND)
    placement_group = models.ForeignKey(
        PlacementGroup, null=True, blank=True, on_delete=models.PROTECT, related_name="vms"
    )
    lease = models.ForeignKey(
        "Lease",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="vms",
        help_text="the reservation this VM runs in: placed on its GPUs, shelved at its end",
    )
    vcpus = models.PositiveIntegerField()
    memory_mib = models.PositiveBigIntegerField()
    gpus = models.PositiveSmallIntegerField(default=0)
    gpu_model = models.CharField(max_length=64, blank=True)
    rdma_vfs = models.PositiveSmallIntegerField(
        default=0,
        help_text="RDMA NIC virtual functions its ports take on its host: one per port on "
        "an RDMA network, fixed when it is created (a VM's ports are its for life)",
    )
    disk_gib = models.PositiveIntegerField()
    ssh_keys = models.JSONField(default=list, blank=True, help_text="OpenSSH public keys")
    user_data = models.TextField(blank=True, help_text="cloud-init user-data")

    state = models.CharField(max_length=16, choices=VmState.choices, default=VmState.PENDING)
    task_state = models.CharField(
        max_length=16, choices=VmTask.choices, default=VmTask.NONE, blank=True
    )
    power_state = models.CharField(
        max_length=16, choices=PowerState.choices, default=PowerState.NOSTATE
    )
    state_reason = models.CharField(max_length=500, blank=True)
    generation = models.PositiveIntegerField(default=1)
    applied_generation = models.PositiveIntegerField(
        default=0, help_text="the generation the host last reported applied"
    )

    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.PROTECT, related_name="vms"
    )
    numa_cell = models.SmallIntegerField(null=True, blank=True)
    rack = models.CharField(max_length=64, blank=True, help_text="its host's rack, once placed")

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    launched_at = models.DateTimeField(null=True, blank=True)
    # What an eviction would lose: the last time it started running (a booted guest starts
    # from what it saved) and the last checkpoint its guest reported
    # (``POST /api/v1/metadata/spot/checkpoint``). Preemption evicts first the spot VMs
    # that lose the least work (``compute.services.spot.UNSAVED_SINCE``). The interval
    # before the last report (since the previous one, or since the guest's start) is how
    # often the guest saves: preemption expects its next save one interval after its last.
    running_since = models.DateTimeField(null=True, blank=True)
    checkpointed_at = models.DateTimeField(null=True, blank=True)
    checkpoint_interval_s = models.FloatField(null=True, blank=True)
    power_observed_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    # The guest's credential for the metadata endpoint (``/api/v1/metadata/``), delivered in
    # its cloud-init seed; it names this VM and grants nothing else.
    metadata_token = models.CharField(
        max_length=64, default=new_metadata_token, editable=False, db_index=True
    )
    # Spot eviction (``compute.services.spot``): the notice, its deadline, the on-demand VM
    # it makes room for, and when and where the VM was evicted.
    eviction_notice_at = models.DateTimeField(null=True, blank=True)
    eviction_deadline = models.DateTimeField(null=True, blank=True)
    eviction_acknowledged_at = models.DateTimeField(null=True, blank=True)
    evicted_for = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="evicting_for_me"
    )
    evicted_at = models.DateTimeField(null=True, blank=True)
    evicted_host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A pending on-demand VM waiting for spot VMs on this host to be evicted for it (indexed
    # where set: ``vm_reserved_host``).
    reserved_host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    # Idleness, from the CPU time its host reports (``compute.services.reclaim``).
    cpu_time_ns = models.PositiveBigIntegerField(null=True, blank=True)
    cpu_sampled_at = models.DateTimeField(null=True, blank=True)
    active_at = models.DateTimeField(
        null=True, blank=True, help_text="last seen using CPU above the idle threshold"
    )
    # Reclamation's next announced step.
    reclaim_action = models.CharField(
        max_length=8, choices=ReclaimAction.choices, default=ReclaimAction.NONE, blank=True
    )
    reclaim_reason = models.CharField(
        max_length=16, choices=ReclaimReason.choices, default=ReclaimReason.NONE, blank=True
    )
    reclaim_at = models.DateTimeField(null=True, blank=True)
    reclaim_noticed_at = models.DateTimeField(null=True, blank=True)
    # Shelving (``compute.services.shelve``): where its kept root disk lives (a path in the
    # shelve store every host reaches); empty when it has none. Set at shelve, kept while
    # the VM lives: an unshelved VM boots from it, and a second shelve keeps it in place.
    kept_disk = models.CharField(max_length=500, blank=True)
    shelved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"],
                condition=~Q(state="deleted"),
                name="unique_live_vm_name",
            )
        ]
        indexes = [
            models.Index(fields=["project", "state"], name="vm_project_state"),
            models.Index(fields=["host", "state"], name="vm_host_state"),
            models.Index(fields=["state", "updated_at"], name="vm_state_updated"),
            models.Index(fields=["state", "eviction_deadline"], name="vm_state_eviction"),
            # The scheduling pass reads the queue's head from these, never the whole queue
            # (``compute.services.vms.vm_schedule_pending``): the VMs that are not plain
            # spot ones by priority and age; plain spot VMs by size, then age; and the plain
            # spot sizes with a VM not yet told it waits for want of room.
            models.Index(
                fields=["priority", "created_at"], condition=QUEUED & ~PLAIN_SPOT, name="vm_queue"
            ),
            models.Index(
                fields=[*SIZE, "created_at"], condition=QUEUED & PLAIN_SPOT, name="vm_queue_spot"
            ),
            models.Index(
                fields=SIZE,
                condition=QUEUED & PLAIN_SPOT & UNTOLD,
                name="vm_queue_spot_untold",
            ),
            # The few VMs waiting for a hand-over, which every load of the hosts' view reads
            # (``compute.placement._open_hosts``): an index of the whole column would hold
            # every VM, all but a handful without a host reserved, and SQLite's planner,
            # seeing one value throughout, read the queue of pending VMs instead.
            models.Index(
                fields=["reserved_host"],
                condition=Q(reserved_host__isnull=False),
                name="vm_reserved_host",
            ),
        ]
        verbose_name = "virtual machine"

    def __str__(self):
        return f"{self.name} ({self.state})"


class CapacityGuarantee(models.Model):
    """A project's guaranteed minimum (mdx's Rmin): ``min_gpus`` GPUs of ``gpu_model`` and
    ``min_vcpus`` vCPUs that are its whenever it asks (``compute.guarantees``).

    - Other projects' on-demand VMs never take the headroom (the minimum less what the
      project's on-demand VMs use): placement refuses them; only spot VMs may run there,
      and they are evicted with their full notice when the project asks.
    - Spot preemption never takes the project's own spot VMs within the minimum
      (``compute.services.spot``).
    - The sum of the minimums of one GPU model never exceeds that model's GPUs in the
      fleet (``compute.guarantees.guarantee_set`` refuses it, under a lock).
    Operators set it; the project reads it."""

    project = models.OneToOneField(
        Project, on_delete=models.CASCADE, related_name="capacity_guarantee"
    )
    min_gpus = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(
        max_length=64, blank=True, help_text="the GPU model of min_gpus, e.g. A100-SXM4-40GB"
    )
    min_vcpus = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project__slug"]

    def __str__(self):
        return f"{self.project}: {self.min_gpus} GPUs guaranteed"


class Lease(ProjectOwnedModel):
    """A reservation (OpenStack Blazar's lease): ``gpus`` GPUs of ``gpu_model`` for the
    project over ``[starts_at, ends_at)`` (``compute.leases``), or ``hosts`` whole hosts of
    that model (every GPU of each: ``gpus`` is their sum).

    Admission counts it against the fleet over time, with the guaranteed minimums and the
    on-demand VMs that hold GPUs now (which have no end). ``KUMO_LEASE_LEAD_S`` before its
    start it takes hold of real GPUs (``LeaseAllocation``: no two leases hold one GPU over
    overlapping periods, a constraint of the database on PostgreSQL) and the spot VMs on
    them get their notice; from its start the project's VMs created in it are placed
    there; at its end they are shelved. It is billed for every GPU-hour it holds, used or
    not, at the rate card's reserved factor. With ``lend_idle``, spot VMs may use the GPUs
    its VMs leave idle while it is active, and get their notice when one of its VMs needs
    them."""

    name = models.CharField(max_length=63, validators=[hostname_validator])
    gpu_model = models.CharField(max_length=64)
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    hosts = models.PositiveIntegerField(
        null=True, blank=True, help_text="whole hosts reserved; empty: GPUs on any hosts"
    )
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    lend_idle = models.BooleanField(
        default=True,
        help_text="while active, spot VMs may run on its idle GPUs; a VM of the lease then "
        "waits for their eviction notice",
    )
    state = models.CharField(
        max_length=16, choices=LeaseState.choices, default=LeaseState.SCHEDULED
    )
    state_reason = models.CharField(max_length=255, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    end_notice_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["starts_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")), name="lease_ends_after_start"
            ),
        ]
        indexes = [models.Index(fields=["state", "starts_at"], name="lease_state_start")]

    def __str__(self):
        return f"{self.name}: {self.gpus} {self.gpu_model} {self.starts_at:%Y-%m-%d %H:%M}"


class LeaseAllocation(models.Model):
    """One GPU a lease holds over ``[starts_at, ends_at)``. On PostgreSQL an exclusion
    constraint (``lease_allocation_no_overlap``: same device, overlapping periods) makes a
    double booking impossible, whatever the code above it does."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="allocations")
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="+")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["lease", "device"], name="unique_lease_device"),
            models.CheckConstraint(
                condition=Q(ends_at__gt=models.F("starts_at")),
                name="lease_allocation_ends_after_start",
            ),
        ]

    def __str__(self):
        return f"{self.lease_id}: {self.device_id}"


class OrphanGuest(models.Model):
    """A Kumo guest a host reported that no live VM on that host accounts for.

    Recorded at first sight; destroyed by the reconcile once it has been an orphan for
    ``KUMO_ORPHAN_GRACE_S`` (a VM being moved or a report racing a create is not an
    orphan for long). Removed when the host stops reporting it.
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="orphans")
    vm_id = models.CharField(max_length=64)
    first_seen_at = models.DateTimeField()
    destroy_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "vm_id"], name="unique_orphan_guest")
        ]

    def __str__(self):
        return f"{self.host.name}:{self.vm_id}"


class ConsoleToken(ProjectOwnedModel):
    """A ticket to one VM's interactive serial console, for one user, on one host.

    Issued by ``compute.services.consoles.console_token_issue`` (the API's ``console``
    action) and redeemed once by the console proxy within ``KUMO_CONSOLE_TOKEN_TTL_S``:
    redeeming is a conditional UPDATE (``used_at IS NULL AND expires_at > now``), so of two
    connections with one token exactly one gets the console. Only the token's SHA-256 is
    kept. Rows are kept for the record (who opened which console when), like audit events.
    """

    digest = models.CharField(max_length=64, unique=True)
    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"console of {self.vm_id} for user {self.user_id}"
