"""What the agent tells the controller. Every report goes to the ``control`` queue."""

import logging
from datetime import UTC, datetime

from celery import current_app

from controlplane.broker import AGENT_REPORT_TASK, CONTROL_QUEUE

log = logging.getLogger(__name__)


def now() -> datetime:
    """The agent's clock, as reports are stamped with it (UTC)."""
    return datetime.now(UTC)


def send(host: str, kind: str, payload: dict, *, taken_at: datetime | None = None) -> None:
    """Send one report; raises if the broker cannot take it (callers decide to retry).

    The report is stamped (``sent_at`` on the wire) with ``taken_at``, when what it says
    was observed (default: now). The controller ignores what is older than the last change
    of the object it concerns, so a report that waited in the broker's backlog never undoes
    or repeats newer work (``compute.services.reconcile.guests_reported``)."""
    current_app.send_task(
        AGENT_REPORT_TASK,
        kwargs={
            "host": host,
            "kind": kind,
            "payload": payload,
            "sent_at": (taken_at or now()).isoformat(),
        },
        queue=CONTROL_QUEUE,
    )


def operation_result(
    host: str, operation_id: str, *, ok: bool, result=None, error_code="", error_message=""
) -> None:
    send(
        host,
        "operation.result",
        {
            "operation_id": operation_id,
            "ok": ok,
            "result": result or {},
            "error_code": error_code,
            "error_message": error_message,
        },
    )
