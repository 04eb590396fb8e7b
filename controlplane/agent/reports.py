"""What the agent tells the controller. Every report goes to the ``control`` queue."""

import logging
from datetime import UTC, datetime

from celery import current_app

from controlplane.broker import AGENT_REPORT_TASK, CONTROL_QUEUE

log = logging.getLogger(__name__)


def send(host: str, kind: str, payload: dict) -> None:
    """Send one report; raises if the broker cannot take it (callers decide to retry)."""
    current_app.send_task(
        AGENT_REPORT_TASK,
        kwargs={
            "host": host,
            "kind": kind,
            "payload": payload,
            "sent_at": datetime.now(UTC).isoformat(),
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
