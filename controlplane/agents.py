"""The controller's side of the host agents: reports in, commands out.

Agents never touch the database. They send reports (``kind`` + ``payload``) to the
``control`` queue; ``controlplane.tasks.agent_report`` hands each to the handler an app
registered here for its kind. Commands go out with ``send_to_host`` on the host's own queue,
after the transaction that decided them commits.
"""

import logging
from collections.abc import Callable

from django.db import transaction

from controlplane.broker import host_queue

log = logging.getLogger(__name__)

ReportHandler = Callable[..., None]
_handlers: dict[str, ReportHandler] = {}


def register_report(kind: str, handler: ReportHandler) -> None:
    """``handler(host=..., payload=..., sent_at=...)`` takes every report of ``kind``."""
    _handlers[kind] = handler


def handler_for(kind: str) -> ReportHandler | None:
    return _handlers.get(kind)


def send_to_host(host: str, task: str, **kwargs) -> None:
    """Send ``task`` to ``host``'s agent once the current transaction commits.

    If the broker is down the message is dropped with an error in the log; what the
    database wants is unchanged, so the periodic reconcile (or the operation reaper)
    takes it from there.
    """
    from controlplane.celery import app

    def publish():
        app.send_task(task, kwargs=kwargs, queue=host_queue(host))

    transaction.on_commit(publish, robust=True)
