from django.db import models


class AuditSource(models.TextChoices):
    API = "api", "API"
    PORTAL = "portal", "Portal"
    ADMIN = "admin", "Admin console"
    CONTROLLER = "controller", "Controller"
    SYSTEM = "system", "System"  # management commands, migrations, bootstrap


class AuditOutcome(models.TextChoices):
    SUCCESS = "success", "Success"
    DENIED = "denied", "Denied"  # not permitted (401/403/404 on a write)
    FAILED = "failed", "Failed"  # refused as invalid or conflicting (400/409/...)


class OperationState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"

    @classmethod
    def finished(cls) -> tuple[str, str]:
        return (cls.SUCCEEDED, cls.FAILED)
