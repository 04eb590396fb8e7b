import logging
from datetime import timedelta

from celery import shared_task

from controlplane import audit
from tenants import services

log = logging.getLogger(__name__)


@shared_task(name="kumo.control.projects_expire", acks_late=True, time_limit=300)
@audit.as_controller
def projects_expire() -> list[str]:
    return services.projects_expire()


@shared_task(name="kumo.control.budgets_check", acks_late=True, time_limit=300)
@audit.as_controller
def budgets_check() -> dict:
    """Alert budget thresholds crossed and stop what over-budget policies stop (beat)."""
    from tenants import billing

    done = billing.budgets_check()
    return {"alerts": len(done["alerts"]), "stopped": done["stopped"]}


@shared_task(name="kumo.control.invoices_issue", acks_late=True, time_limit=1800)
@audit.as_controller
def invoices_issue() -> int:
    """Issue last month's invoices once it has ended (beat, daily; repeating is harmless:
    a project already invoiced keeps its invoice). Waits while no rate card covers it."""
    from django.utils import timezone

    from controlplane.errors import Conflict
    from tenants import billing

    last_month = billing.month_start(billing.month_start(timezone.now().date()) - timedelta(days=1))
    try:
        return len(billing.invoices_issue(period=last_month))
    except Conflict as e:  # no rate card for that month yet: nothing can be rated
        log.warning("invoices of %s not issued: %s", f"{last_month:%Y-%m}", e.message)
        return 0


@shared_task(name="kumo.control.federation_metadata_refresh", acks_late=True, time_limit=600)
@audit.as_controller
def federation_metadata_refresh() -> dict:
    """Fetch the federation's metadata aggregate again (beat); a bad copy is refused and the
    last good one kept."""
    from django.conf import settings

    from tenants.federation import metadata

    if not settings.SAML_METADATA_URL:
        return {"enabled": False}
    row = metadata.metadata_refresh()
    return {"enabled": True, "idps": row.idp_count, "error": row.last_error}


@shared_task(name="kumo.control.renewal_reminders_send", acks_late=True, time_limit=600)
@audit.as_controller
def renewal_reminders_send() -> int:
    """Remind owners of projects ending in 30 and 7 days (beat, hourly; each goes once)."""
    from tenants import applications

    return len(applications.renewal_reminders_send())
