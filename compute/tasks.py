from celery import shared_task

from compute import services
from controlplane import audit
from controlplane.choices import AuditSource


@shared_task(name="kumo.control.hosts_check", acks_late=True, time_limit=60)
def hosts_check() -> list[str]:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.hosts_check()
