"""The controller's Celery tasks: thin, each loads by id and calls a service."""

import logging
import random
import time
from datetime import datetime

from celery import shared_task
from django.db import OperationalError, connection

from controlplane import agents, audit, services
from controlplane.broker import AGENT_REPORT_TASK, BUNDLE_REPORT
from controlplane.events import (  # noqa: F401  (the controller registers it from here)
    WEBHOOK_ATTEMPTS,
    webhook_deliver,
)

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

    A ``bundle`` (``controlplane.broker.BUNDLE_REPORT``) carries the reports an agent sent
    together (its heartbeat and the periodic reports due with it), each with its own kind,
    payload and ``sent_at``: they are handled one after the other, in their order, exactly
    as if each had come alone; one that fails is logged and the others still run, then the
    first error is raised."""
    if kind != BUNDLE_REPORT:
        _handle(host, kind, payload, sent_at)
        return
    failed = None
    for part in payload.get("reports", []):
        try:
            _handle(host, part["kind"], part["payload"], part["sent_at"])
        except Exception as e:  # the bundle's other reports still count
            log.exception("host %s: %s report failed", host, part.get("kind"))
            failed = failed or e
    if failed is not None:
        raise failed


def _handle(host: str, kind: str, payload: dict, sent_at: str) -> None:
    """One report. An unknown kind is logged and dropped (an agent newer than its
    controller). A deadlock or serialization failure runs the handler again
    (``REPORT_ATTEMPTS``); past that the error is raised, and the host's next report carries
    the same facts."""
    handler = agents.handler_for(kind)
    if handler is None:
        log.warning("host %s sent a report of unknown kind %r; dropped", host, kind)
        return
    for attempt in range(1, REPORT_ATTEMPTS + 1):
        try:
            with audit.controller():
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
@audit.as_controller
def operations_reap() -> int:
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
