"""The controller's Celery tasks: thin, each loads by id and calls a service."""

import logging
import random
import time
from datetime import datetime

from celery import shared_task
from django.db import OperationalError, connection

from controlplane import agents, audit, egress, services
from controlplane.broker import AGENT_REPORT_TASK
from controlplane.choices import AuditSource

log = logging.getLogger(__name__)

# A report's transaction that PostgreSQL aborted as a deadlock victim or a serialization
# failure is run again, this many times in all (each handler is one transaction, or
# several that each stand alone, so running one again is safe).
REPORT_ATTEMPTS = 4
_RETRIED_SQLSTATES = {"40P01", "40001"}  # deadlock_detected, serialization_failure


def retryable(error: OperationalError) -> bool:
    """Whether ``error`` is PostgreSQL aborting a transaction that may simply run again."""
    return getattr(error.__cause__, "sqlstate", None) in _RETRIED_SQLSTATES


@shared_task(name=AGENT_REPORT_TASK, acks_late=True, time_limit=60)
def agent_report(*, host: str, kind: str, payload: dict, sent_at: str) -> None:
    """A report from a host agent: dispatched to the handler registered for its kind.
    An unknown kind is logged and dropped (an agent newer than its controller). A deadlock
    or serialization failure runs the handler again (``REPORT_ATTEMPTS``); past that the
    error is raised, and the host's next report carries the same facts."""
    handler = agents.handler_for(kind)
    if handler is None:
        log.warning("host %s sent a report of unknown kind %r; dropped", host, kind)
        return
    for attempt in range(1, REPORT_ATTEMPTS + 1):
        try:
            with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
                handler(host=host, payload=payload, sent_at=datetime.fromisoformat(sent_at))
            return
        except OperationalError as e:
            if not retryable(e) or attempt == REPORT_ATTEMPTS or connection.in_atomic_block:
                raise
            log.warning(
                "host %s: %s report aborted (%s); attempt %d of %d",
                host,
                kind,
                e.__cause__.sqlstate,
                attempt + 1,
                REPORT_ATTEMPTS,
            )
            time.sleep(random.uniform(0.02, 0.1) * attempt)


@shared_task(name="kumo.control.operations_reap", acks_late=True, time_limit=120)
def operations_reap() -> int:
    with audit.audit_context(source=AuditSource.CONTROLLER, actor=None):
        return services.operations_reap()


@shared_task(name="kumo.control.idempotency_purge", acks_late=True, time_limit=300)
def idempotency_purge() -> int:
    return services.idempotency_keys_purge()


def _operation_result(*, host: str, payload: dict, sent_at) -> None:
    services.operation_finish(
        operation_id=payload["operation_id"],
        ok=bool(payload.get("ok")),
        result=payload.get("result") or {},
        error_code=payload.get("error_code", ""),
        error_message=payload.get("error_message", ""),
    )


agents.register_report("operation.result", _operation_result)


# A failed webhook delivery is tried again this many times in all, after 2, 4, 8 ... seconds
# (at most WEBHOOK_BACKOFF_MAX_S apart).
WEBHOOK_ATTEMPTS = 9
WEBHOOK_BACKOFF_MAX_S = 300


def webhook_retry_in(attempt: int) -> int:
    """Seconds before delivery attempt ``attempt + 1``."""
    return min(2**attempt, WEBHOOK_BACKOFF_MAX_S)


@shared_task(name="kumo.control.webhook_deliver", acks_late=True, time_limit=60)
def webhook_deliver(*, webhook_id: int, event_id: int, attempt: int = 1) -> int:
    """POST one event to one webhook; a network error or a 5xx is tried again with backoff
    (``WEBHOOK_ATTEMPTS``), a 4xx is recorded and not retried (the receiver refused it).
    Each failed delivery is one line in the log, never a traceback: a dead receiver is the
    project's affair, and its last status is on the webhook for them to see. A destination
    ``controlplane.egress`` refuses (not public, not allowed by the operator) gets nothing;
    the refusal is recorded as its status and not retried."""
    import httpx
    from django.utils import timezone

    from controlplane.events import SIGNATURE_HEADER, body, signature
    from controlplane.models import Event, Webhook

    hook = Webhook.objects.filter(pk=webhook_id, active=True).first()
    event = Event.objects.select_related("project").filter(pk=event_id).first()
    if hook is None or event is None:
        return 0
    data = body(event)
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: signature(hook.secret, data)}
    try:
        response = egress.post(hook.url, content=data, headers=headers, timeout=10)
        status = str(response.status_code)
    except egress.Refused as e:  # nothing was sent; not retried
        Webhook.objects.filter(pk=hook.pk).update(
            last_delivery_at=timezone.now(), last_status=f"refused: {e.reason}"[:200]
        )
        log.warning("webhook %s of %s: refused: %s", hook.pk, event.project.slug, e.reason)
        return 0
    except httpx.HTTPError as e:
        status = f"error: {e}"[:200]
        response = None
    Webhook.objects.filter(pk=hook.pk).update(last_delivery_at=timezone.now(), last_status=status)
    if response is None or response.status_code >= 500:
        if attempt >= WEBHOOK_ATTEMPTS:
            log.warning(
                "webhook %s event %s: delivery %d of %d failed (%s); given up",
                hook.pk, event.pk, attempt, WEBHOOK_ATTEMPTS, status,
            )  # fmt: skip
        else:
            delay = webhook_retry_in(attempt)
            log.warning(
                "webhook %s event %s: delivery %d of %d failed (%s); next in %d s",
                hook.pk, event.pk, attempt, WEBHOOK_ATTEMPTS, status, delay,
            )  # fmt: skip
            webhook_deliver.apply_async(
                kwargs={"webhook_id": webhook_id, "event_id": event_id, "attempt": attempt + 1},
                countdown=delay,
            )
        return response.status_code if response is not None else 0
    return response.status_code
