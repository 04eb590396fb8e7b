from django.db import models


class Role(models.TextChoices):
    """A member's role in a project, from least to most power.

    Order matters: ``Role.at_least(x, y)`` compares by position in this list.
    """

    READER = "reader", "Reader"  # reads everything in the project
    MEMBER = "member", "Member"  # also creates and operates the project's resources
    ADMIN = "admin", "Admin"  # also manages members and project settings
    OWNER = "owner", "Owner"  # also deletes the project and names other owners

    @classmethod
    def rank(cls, role: str) -> int:
        return cls.values.index(role)

    @classmethod
    def at_least(cls, role: str | None, required: str) -> bool:
        return role is not None and cls.rank(role) >= cls.rank(required)


class ProjectStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    SUSPENDED = "suspended", "Suspended"  # by an operator: nothing new may start
    EXPIRED = "expired", "Expired"  # past its validity end


class SSHKeyType(models.TextChoices):
    ED25519 = "ssh-ed25519", "Ed25519"
    RSA = "ssh-rsa", "RSA"
    ECDSA_P256 = "ecdsa-sha2-nistp256", "ECDSA P-256"
    ECDSA_P384 = "ecdsa-sha2-nistp384", "ECDSA P-384"
    ECDSA_P521 = "ecdsa-sha2-nistp521", "ECDSA P-521"


# --- billing -----------------------------------------------------------------------------------


class UsageResource(models.TextChoices):
    """What a usage interval measures, and the unit its rate card price is per."""

    VCPU = "vcpu", "vCPU-hour"
    MEMORY = "memory", "GiB-hour of memory"
    GPU = "gpu", "GPU-hour (priced by model)"
    STORAGE = "storage", "GiB-month of storage"
    GLOBAL_IP = "global_ip", "global-IP-hour"


class BillingPriority(models.TextChoices):
    """How the capacity was bought; the rate card's factor for it multiplies the price."""

    ON_DEMAND = "on_demand", "On demand"
    SPOT = "spot", "Spot"
    RESERVED = "reserved", "Reserved"
    HELD = "held", "Held (a stopped VM's claim)"


class BudgetPolicy(models.TextChoices):
    """What happens when a project's month-to-date spend reaches 100 % of a budget."""

    NOTIFY = "notify", "Notify only"
    STOP_SPOT = "stop_spot", "Stop spot VMs"
    STOP_ALL = "stop_all", "Stop spot VMs, then every other VM"


class PointsKind(models.TextChoices):
    CREDIT = "credit", "Credit (points bought or granted)"
    DEBIT = "debit", "Debit (an invoice drawn from the points)"
    ADJUSTMENT = "adjustment", "Adjustment by an operator"
