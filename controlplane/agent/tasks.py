"""Host tasks every agent runs, whatever drivers it has."""

import logging
import time

from celery import shared_task

from controlplane.agent import VERSION, reports, runtime

log = logging.getLogger(__name__)


@shared_task(name="kumo.host.agent.ping", acks_late=True, time_limit=30, ignore_result=True)
def ping(*, operation_id: str) -> None:
    """Answer a ping operation with the agent's version and uptime. Idempotent: a repeated
    message answers again and the controller keeps the first answer."""
    config = runtime.config()
    log.info("ping for operation %s", operation_id)
    reports.operation_result(
        config.host,
        operation_id,
        ok=True,
        result={
            "host": config.host,
            "version": VERSION,
            "uptime_s": round(time.monotonic() - runtime.STARTED, 3),
        },
    )
