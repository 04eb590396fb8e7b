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
