"""Prometheus metrics of Celery work, counted in every worker (controller and agents).

With ``PROMETHEUS_MULTIPROC_DIR`` set (``manage.py run`` sets it), every process of the
machine writes its counts there and ``/metrics`` on the web process sums them.
Django-free: the host agent imports it too.
"""

import time

from celery import signals
from prometheus_client import Counter, Histogram

TASKS = Counter("kumo_celery_tasks_total", "Celery tasks by name and outcome", ["task", "outcome"])
TASKS_SENT = Counter("kumo_celery_tasks_sent_total", "Celery tasks published, by name", ["task"])
TASK_SECONDS = Histogram("kumo_celery_task_seconds", "Celery task run time", ["task"])

_started: dict[str, float] = {}
_instrumented = False


def _on_prerun(task_id=None, task=None, **_):
    _started[task_id] = time.monotonic()


def _on_postrun(task_id=None, task=None, state=None, **_):
    started = _started.pop(task_id, None)
    if started is not None:
        TASK_SECONDS.labels(task.name).observe(time.monotonic() - started)
    TASKS.labels(task.name, (state or "unknown").lower()).inc()


def _on_retry(request=None, **_):
    TASKS.labels(getattr(request, "task", "unknown"), "retry").inc()


def _on_publish(sender=None, **_):
    TASKS_SENT.labels(sender or "unknown").inc()


def instrument_celery() -> None:
    global _instrumented
    if _instrumented:
        return
    signals.task_prerun.connect(_on_prerun, weak=False)
    signals.task_postrun.connect(_on_postrun, weak=False)
    signals.task_retry.connect(_on_retry, weak=False)
    signals.before_task_publish.connect(_on_publish, weak=False)
    _instrumented = True
