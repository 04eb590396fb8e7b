"""The controller's network tasks: thin, each calls a service."""

from celery import shared_task

from controlplane import audit
from network import sync


@shared_task(name="kumo.control.network_sync", acks_late=True, time_limit=120)
@audit.as_controller
def network_sync() -> int:
    """Re-send desired state to hosts that have not applied it (beat, every
    ``KUMO_NETWORK_SYNC_S``)."""
    return sync.send_unconverged()
