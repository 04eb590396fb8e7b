import logging
from datetime import timedelta

from celery import shared_task

from controlplane import audit
from controlplane.choices import AuditSource
from tenants import services

log = logging.getLogger(__name__)


@shared_task(name="kumo.control.projects_expire", acks_late=True, time_limit=300)
def projects_expire() -> list[str]:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.projects_expire()


@shared_task(name="kumo.control.budgets_check", acks_late=True, time_limit=300)
def budgets_check() -> dict:
    """Alert budget thresholds crossed and stop what over-budget policies stop (beat)."""
    from tenants import billing

    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        done = billing.budgets_check()
    return {"alerts": len(done["alerts"]), "stopped": done["stopped"]}


@shared_task(name="kumo.control.invoices_issue", acks_late=True, time_limit=1800)
def invoices_issue() -> int:
    """Issue last month's invoices once it has ended (beat, daily; repeating is harmless:
    a project already invoiced keeps its invoice). Waits while no rate card covers it."""
    from django.utils import timezone

    from controlplane.errors import Conflict
    from tenants import billing

    last_month = billing.month_start(billing.month_start(timezone.now().date()) - timedelta(days=1))
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        try:
            return len(billing.invoices_issue(period=last_month))
        except Conflict as e:  # no rate card for that month yet: nothing can be rated
            log.warning("invoices of %s not issued: %s", f"{last_month:%Y-%m}", e.message)
            return 0


@shared_task(name="kumo.control.federation_metadata_refresh", acks_late=True, time_limit=600)
def federation_metadata_refresh() -> dict:
    """Fetch the federation's metadata aggregate again (beat); a bad copy is refused and the
    last good one kept."""
    from django.conf import settings

    from tenants.federation import metadata

    if not settings.SAML_METADATA_URL:
        return {"enabled": False}
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        row = metadata.metadata_refresh()
    return {"enabled": True, "idps": row.idp_count, "error": row.last_error}


@shared_task(name="kumo.control.renewal_reminders_send", acks_late=True, time_limit=600)
def renewal_reminders_send() -> int:
    """Remind owners of projects ending in 30 and 7 days (beat, hourly; each goes once)."""
    from tenants import applications

    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return len(applications.renewal_reminders_send())
