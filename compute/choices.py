from django.db import models


class HostState(models.TextChoices):
    ENROLLING = "enrolling", "Enrolling"  # known, agent not heard from yet
    UP = "up", "Up"
    DRAINING = "draining", "Draining"  # runs what it has, takes nothing new
    MAINTENANCE = "maintenance", "Maintenance"  # an operator took it out of service
    DOWN = "down", "Down"  # its agent missed heartbeats


# States an operator sets; the controller never leaves them by itself.
OPERATOR_STATES = (HostState.DRAINING, HostState.MAINTENANCE)


class DeviceKind(models.TextChoices):
    """Mirrors ``compute.drivers.base.DeviceKind`` (the agent's side of the wire)."""

    GPU = "gpu", "GPU"
    RDMA_VF = "rdma_vf", "RDMA NIC virtual function"
    RDMA_PF = "rdma_pf", "RDMA NIC physical function"


class ImageFormat(models.TextChoices):
    QCOW2 = "qcow2", "qcow2"
    RAW = "raw", "raw"


class ImageState(models.TextChoices):
    """An image's life: its record is made ``uploading``; its bytes arrive in one streamed
    upload (``compute.services.images``) and it turns ``active`` (bootable) or ``failed``
    (with the reason); a deleted image stays for the record of the VMs booted from it."""

    UPLOADING = "uploading", "Uploading"
    ACTIVE = "active", "Active"
    FAILED = "failed", "Failed"
    DELETED = "deleted", "Deleted"


class Visibility(models.TextChoices):
    PUBLIC = "public", "Public"  # every project may boot it
    PROJECT = "project", "Project"  # only the project that owns it


class PlacementPolicy(models.TextChoices):
    AFFINITY = "affinity", "Affinity"  # every member on one host
    ANTI_AFFINITY = "anti_affinity", "Anti-affinity"  # no two members on one host
    COMPACT = "compact", "Compact"  # every member in one rack (one leaf switch)


class Priority(models.TextChoices):
    ON_DEMAND = "on_demand", "On demand"
    SPOT = "spot", "Spot"  # runs on unclaimed capacity; may be evicted


class VmState(models.TextChoices):
    """The VM's life as the control plane sees it. Transitions are guarded in
    ``compute.services`` (see ``ACTIONS``); an illegal action answers 409 with the state."""

    PENDING = "pending", "Pending"  # accepted, waiting for capacity
    PROVISIONING = "provisioning", "Provisioning"  # placed; its host is building it
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    DELETING = "deleting", "Deleting"
    DELETED = "deleted", "Deleted"
    ERROR = "error", "Error"
    EVICTING = "evicting", "Evicting"  # spot: notice given, about to stop
    EVICTED = "evicted", "Evicted"
    SHELVING = "shelving", "Shelving"  # its guest stops and its root disk is being kept
    SHELVED = "shelved", "Shelved"  # holds no host, GPU or quota; its root disk is kept


class EvictAction(models.TextChoices):
    """What becomes of a spot VM at the end of its eviction notice (its template says)."""

    STOP = "stop", "Stop (evicted: holds nothing, restart from its image)"
    SHELVE = "shelve", "Shelve (holds nothing, its root disk is kept for unshelve)"


class ReclaimAction(models.TextChoices):
    """The next step reclamation has announced for a VM (``compute.services.reclaim``)."""

    NONE = "", "None"
    STOP = "stop", "Stop"  # announced as such; done by shelving (``compute.services.shelve``)
    DELETE = "delete", "Delete"


class ReclaimReason(models.TextChoices):
    NONE = "", "None"
    PROJECT_EXPIRED = "project_expired", "Project past its end date"
    IDLE = "idle", "Idle"


class VmTask(models.TextChoices):
    """The action in flight on a settled VM (Nova's task state); empty when idle."""

    NONE = "", "None"
    STARTING = "starting", "Starting"
    STOPPING = "stopping", "Stopping"
    REBOOTING = "rebooting", "Rebooting"
    RESETTING = "resetting", "Resetting"  # a hard reset (the reset button)
    POWERING_OFF = "powering_off", "Powering off"  # forced off at once (pulling the plug)


class PowerState(models.TextChoices):
    """What the host last reported of the guest (Nova's power state)."""

    NOSTATE = "nostate", "No state"  # never reported yet
    RUNNING = "running", "Running"
    SHUTOFF = "shutoff", "Shut off"
    PAUSED = "paused", "Paused"
    CRASHED = "crashed", "Crashed"
    ABSENT = "absent", "Absent"  # the host has no such guest
    UNKNOWN = "unknown", "Unknown"  # its host is down


class DesiredPower(models.TextChoices):
    """What the agent is asked to converge the guest to."""

    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    ABSENT = "absent", "Absent"


class LeaseState(models.TextChoices):
    """A reservation's life (``compute.leases``)."""

    SCHEDULED = "scheduled", "Scheduled"  # admitted; its GPUs are counted, none held yet
    PREPARING = "preparing", "Preparing"  # GPUs held; spot VMs on them have their notice
    ACTIVE = "active", "Active"  # between start and end: the project's VMs run in it
    ENDED = "ended", "Ended"
    CANCELLED = "cancelled", "Cancelled"
