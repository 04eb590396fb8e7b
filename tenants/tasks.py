from celery import shared_task

from controlplane import audit
from controlplane.choices import AuditSource
from tenants import services


@shared_task(name="kumo.control.projects_expire", acks_late=True, time_limit=300)
def projects_expire() -> list[str]:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.projects_expire()
