"""The controller's storage tasks: thin, each calls a service."""

from celery import shared_task

from controlplane import audit
from storage import services


@shared_task(name="kumo.control.shares_sync", acks_late=True, time_limit=300)
@audit.as_controller
def shares_sync() -> int:
    """Send every share to its host again (beat, every ``KUMO_SHARE_SYNC_S``)."""
    return services.shares_sync()


@shared_task(name="kumo.control.buckets_measure", acks_late=True, time_limit=900)
@audit.as_controller
def buckets_measure() -> int:
    """Read every bucket's usage (beat, every ``KUMO_BUCKET_USAGE_S``); nothing to do
    where no object store is configured."""
    from django.conf import settings

    if not settings.OBJECT_STORE["kind"]:
        return 0
    return services.buckets_measure()
