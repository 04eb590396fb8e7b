"""The agent's Celery app: consumes ``host.<name>``, sends heartbeats and periodic reports to
``control``."""

import logging
import time
from datetime import UTC, datetime

from celery import Celery, bootsteps

from controlplane import metrics
from controlplane.agent import plugins, reports, runtime
from controlplane.agent.config import AgentConfig
from controlplane.broker import host_queue

log = logging.getLogger("kumo.agent")


class Reports(bootsteps.StartStopStep):
    """Sends the heartbeat (every ``heartbeat_s``) and each app's periodic reports
    (``plugins.REPORTERS``, each every its interval), all of them once at start, so a
    restarted agent is reconciled at once.

    It wakes every shortest interval and sends what is due then as one bundle
    (``reports.bundled``): the heartbeat first, so a new host enrolls before its other
    reports are read. A report that cannot be made (the hypervisor down) is logged and left
    out; a bundle that cannot be sent (the broker down) is logged and skipped; each report
    is due again one interval later, and the controller marks the host down only after its
    timeout.
    """

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.trefs = []
        self.started_at = datetime.now(UTC).isoformat()
        self.reports: list[tuple[str, object, float]] = []
        self.last: dict[str, float] = {}
        self.tick_s = 0.0

    def start(self, worker):
        config = runtime.config()
        self.reports = [("heartbeat", self.heartbeat, config.heartbeat_s)] + [
            (path, _resolve(path), getattr(config, field)) for path, field in plugins.REPORTERS
        ]
        self.tick_s = min(interval for _, _, interval in self.reports)
        # The first soon after start, in the timer's thread, as every later one.
        self.trefs = [
            worker.timer.call_after(0.5, self.tick, (), priority=10),
            worker.timer.call_repeatedly(self.tick_s, self.tick, (), priority=10),
        ]

    def stop(self, worker):
        for tref in self.trefs:
            tref.cancel()
        self.trefs = []

    def heartbeat(self):
        config = runtime.config()
        reports.send(config.host, "heartbeat", plugins.heartbeat_payload(config, self.started_at))

    def due(self, now: float) -> list[tuple[str, object]]:
        """The reports due at ``now`` (monotonic): never sent, or sent an interval ago (less
        half a tick, so an interval that is not a multiple of the tick rounds to the nearest
        tick rather than to the next)."""
        return [
            (name, report)
            for name, report, interval in self.reports
            if name not in self.last or now - self.last[name] >= interval - self.tick_s / 2
        ]

    def tick(self):
        config = runtime.config()
        now = time.monotonic()
        try:
            with reports.bundled(config.host):
                for name, report in self.due(now):
                    self.last[name] = now
                    try:
                        report()
                    except Exception as e:  # the hypervisor may be down: next time
                        log.warning("report %s not made: %s", name, e)
        except Exception as e:  # the broker may be down: try again next time
            log.warning("reports of %s not sent: %s", config.host, e)


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
    app.steps["worker"].add(Reports)
    app.conf.include = list(plugins.HOST_TASK_MODULES)
    metrics.instrument_celery()
    return app
