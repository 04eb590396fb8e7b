"""The controller's periodic compute work. Thin: each calls one service."""

from celery import shared_task

from compute import services
from controlplane import audit
from controlplane.choices import AuditSource


@shared_task(name="kumo.control.hosts_check", acks_late=True, time_limit=60)
def hosts_check() -> list[str]:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.hosts_check()


@shared_task(name="kumo.control.vms_schedule_pending", acks_late=True, time_limit=120)
def vms_schedule_pending() -> int:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.vm_schedule_pending()


@shared_task(name="kumo.control.vms_reap_stuck", acks_late=True, time_limit=120)
def vms_reap_stuck() -> int:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.vms_reap_stuck()


@shared_task(name="kumo.control.evictions_reap", acks_late=True, time_limit=60)
def evictions_reap() -> int:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.evictions_reap()


@shared_task(name="kumo.control.reclaim", acks_late=True, time_limit=300)
def reclaim() -> dict:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.reclaim_run()
