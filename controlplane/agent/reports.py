"""What the agent tells the controller. Every report goes to the ``control`` queue.

The periodic reports that fall due together (the heartbeat, the guests and network reports)
go out as one message, a ``bundle`` (``bundled``): a fleet's controller then takes one
message per host and period instead of one per report, and the broker's and Celery's cost
of a message is paid once. Reports of events (an operation's result) go out at once, alone.
"""

import logging
import threading
from contextlib import contextmanager
from datetime import UTC, datetime

from celery import current_app

from controlplane.broker import AGENT_REPORT_TASK, BUNDLE_REPORT, CONTROL_QUEUE

log = logging.getLogger(__name__)

_bundle = threading.local()  # the reports ``bundled`` is collecting in this thread


def now() -> datetime:
    """The agent's clock, as reports are stamped with it (UTC)."""
    return datetime.now(UTC)


def send(host: str, kind: str, payload: dict, *, taken_at: datetime | None = None) -> None:
    """Send one report; raises if the broker cannot take it (callers decide to retry).

    The report is stamped (``sent_at`` on the wire) with ``taken_at``, when what it says
    was observed (default: now). The controller ignores what is older than the last change
    of the object it concerns, so a report that waited in the broker's backlog never undoes
    or repeats newer work (``compute.services.reconcile.guests_reported``).

    Inside ``bundled`` (in the same thread) the report joins the bundle instead."""
    stamp = (taken_at or now()).isoformat()
    parts = getattr(_bundle, "parts", None)
    if parts is not None:
        parts.append({"kind": kind, "payload": payload, "sent_at": stamp})
        return
    _publish(host, kind, payload, stamp)


@contextmanager
def bundled(host: str):
    """Every report ``send`` is given inside (in this thread) goes out at the end as one
    ``bundle`` message, each report keeping its kind, payload and stamp; the controller
    handles them in order, as if each had come alone. Nothing is sent if nothing was
    reported, or if the block raised; a bundle the broker cannot take raises."""
    if getattr(_bundle, "parts", None) is not None:
        yield  # already collecting: the outer bundle takes them
        return
    _bundle.parts = parts = []
    try:
        yield
    finally:
        _bundle.parts = None
    if parts:
        _publish(host, BUNDLE_REPORT, {"reports": parts}, now().isoformat())


def _publish(host: str, kind: str, payload: dict, sent_at: str) -> None:
    current_app.send_task(
        AGENT_REPORT_TASK,
        kwargs={
            "host": host,
            "kind": kind,
            "payload": payload,
            "sent_at": sent_at,
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
