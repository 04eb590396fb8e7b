"""The agent's Celery app: consumes ``host.<name>``, sends heartbeats to ``control``."""

import logging
from datetime import UTC, datetime

from celery import Celery, bootsteps

from controlplane import metrics
from controlplane.agent import plugins, reports, runtime
from controlplane.agent.config import AgentConfig
from controlplane.broker import host_queue

log = logging.getLogger("kumo.agent")


class Heartbeat(bootsteps.StartStopStep):
    """Sends a heartbeat when the worker starts and every ``heartbeat_s`` after.

    A heartbeat that cannot be sent (broker down) is logged and skipped; the next one tries
    again, and the controller marks the host down only after its timeout.
    """

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.tref = None
        self.started_at = datetime.now(UTC).isoformat()

    def start(self, worker):
        config = runtime.config()
        self.beat()
        self.tref = worker.timer.call_repeatedly(config.heartbeat_s, self.beat, (), priority=10)

    def stop(self, worker):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def beat(self):
        config = runtime.config()
        try:
            reports.send(
                config.host, "heartbeat", plugins.heartbeat_payload(config, self.started_at)
            )
        except Exception as e:  # the broker may be down: try again next time
            log.warning("heartbeat of %s not sent: %s", config.host, e)


class PeriodicReports(bootsteps.StartStopStep):
    """Sends each app's periodic reports (``plugins.REPORTERS``): once at start, so a
    restarted agent is reconciled at once, then every interval."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.trefs = []

    def start(self, worker):
        config = runtime.config()
        for path, interval_field in plugins.REPORTERS:
            report = _resolve(path)
            worker.timer.call_after(0.5, self._send, (path, report), priority=5)
            self.trefs.append(
                worker.timer.call_repeatedly(
                    getattr(config, interval_field), self._send, (path, report), priority=5
                )
            )

    def stop(self, worker):
        for tref in self.trefs:
            tref.cancel()
        self.trefs = []

    @staticmethod
    def _send(path, report):
        try:
            report()
        except Exception as e:  # the broker or the hypervisor may be down: next time
            log.warning("report %s not sent: %s", path, e)


def _resolve(path: str):
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _close_drivers(**_kwargs) -> None:
    """On shutdown, close the hypervisor connection before the interpreter tears it down."""
    try:
        runtime.close_hypervisor()
    except Exception as e:  # shutting down: say it, never raise
        log.warning("hypervisor connection not closed cleanly: %s", e)


def create_app(config: AgentConfig) -> Celery:
    runtime.configure(config)
    app = Celery(f"kumo-agent-{config.host}", set_as_current=True)
    app.conf.update(
        broker_url=config.broker_url,
        broker_transport_options=config.transport_options,
        broker_connection_retry_on_startup=True,
        task_default_queue=host_queue(config.host),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=True,
        task_publish_retry_policy={"max_retries": 3, "interval_start": 0, "interval_step": 0.5},
    )
    from celery.signals import worker_shutdown

    worker_shutdown.connect(_close_drivers, weak=False)
    app.steps["worker"].add(Heartbeat)
    app.steps["worker"].add(PeriodicReports)
    app.conf.include = list(plugins.HOST_TASK_MODULES)
    metrics.instrument_celery()
    return app
