"""The controller's Celery app: queue ``control``, periodic work for beat.

Start the controller with ``celery -A controlplane.celery worker -Q control`` and beat with
``celery -A controlplane.celery beat``. Host agents run a different, Django-free app
(``controlplane.agent``) on their own queues.
"""

import os

from celery import Celery, signals

from controlplane import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from django.conf import settings
from django.db import close_old_connections

app = Celery("kumo")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_publish_retry_policy = {
    # A request never waits long on a dead broker: the reconcile re-issues what was lost.
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
app.conf.beat_schedule = {
    "reap-stuck-operations": {"task": "kumo.control.operations_reap", "schedule": 30.0},
    "purge-idempotency-keys": {"task": "kumo.control.idempotency_purge", "schedule": 3600.0},
    "check-host-heartbeats": {"task": "kumo.control.hosts_check", "schedule": 10.0},
    "expire-projects": {"task": "kumo.control.projects_expire", "schedule": 3600.0},
    "place-pending-vms": {"task": "kumo.control.vms_schedule_pending", "schedule": 15.0},
    "reap-stuck-vms": {"task": "kumo.control.vms_reap_stuck", "schedule": 60.0},
    "check-budgets": {"task": "kumo.control.budgets_check", "schedule": 300.0},
    "issue-invoices": {"task": "kumo.control.invoices_issue", "schedule": 86400.0},
    "reap-spot-evictions": {
        "task": "kumo.control.evictions_reap",
        "schedule": settings.SPOT_REAP_S,
    },
    "reclaim": {"task": "kumo.control.reclaim", "schedule": settings.RECLAIM_INTERVAL_S},
    "move-leases-on": {"task": "kumo.control.leases_tick", "schedule": settings.LEASE_TICK_S},
    "sync-host-networks": {
        "task": "kumo.control.network_sync",
        "schedule": settings.NETWORK_SYNC_S,
    },
    "sync-shares": {"task": "kumo.control.shares_sync", "schedule": settings.SHARE_SYNC_S},
    "renewal-reminders": {"task": "kumo.control.renewal_reminders_send", "schedule": 3600.0},
    "refresh-federation-metadata": {
        "task": "kumo.control.federation_metadata_refresh",
        "schedule": settings.SAML_METADATA_REFRESH_S,
    },
    "measure-buckets": {
        "task": "kumo.control.buckets_measure",
        "schedule": settings.BUCKET_USAGE_S,
    },
}
app.autodiscover_tasks(["controlplane", "tenants", "compute", "network", "storage"])
metrics.instrument_celery()

# Celery's Django fixup closes every database connection before and after each task unless
# ``CELERY_DB_REUSE_MAX`` is set: each task then opened a new PostgreSQL connection (a server
# process forked and authenticated), which was most of what an agent's report cost the
# controller. A task is treated as Django treats a request instead: before and after it,
# ``close_old_connections`` closes a connection past ``CONN_MAX_AGE`` or left unusable and
# keeps the others. (The fixup's own closing is put off to every millionth task.)
app.conf.update(CELERY_DB_REUSE_MAX=10**6)


def _old_connections_closed(task=None, **_):
    if task is not None and not getattr(task.request, "is_eager", False):
        close_old_connections()  # an eager task runs in its caller's transaction: not there


signals.task_prerun.connect(_old_connections_closed, weak=False)
signals.task_postrun.connect(_old_connections_closed, weak=False)
