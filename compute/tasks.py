"""The controller's periodic compute work. Thin: each calls one service."""

from celery import shared_task

from compute import services
from compute.protocol import SCHEDULE_PENDING_TASK
from controlplane import audit


@shared_task(name="kumo.control.hosts_check", acks_late=True, time_limit=60)
@audit.as_controller
def hosts_check() -> list[str]:
    return services.hosts_check()


@shared_task(name=SCHEDULE_PENDING_TASK, acks_late=True, time_limit=120)
@audit.as_controller
def vms_schedule_pending() -> int:
    return services.vm_schedule_pending()


@shared_task(name="kumo.control.vms_reap_stuck", acks_late=True, time_limit=120)
@audit.as_controller
def vms_reap_stuck() -> int:
    return services.vms_reap_stuck()


@shared_task(name="kumo.control.evictions_reap", acks_late=True, time_limit=60)
@audit.as_controller
def evictions_reap() -> int:
    return services.evictions_reap()


@shared_task(name="kumo.control.leases_tick", acks_late=True, time_limit=120)
@audit.as_controller
def leases_tick() -> dict:
    return services.leases_tick()


@shared_task(name="kumo.control.reclaim", acks_late=True, time_limit=300)
@audit.as_controller
def reclaim() -> dict:
    return services.reclaim_run()
