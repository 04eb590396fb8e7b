"""Telling a project what happened to it: events, webhooks and mail.

``emit`` records an ``Event`` in the caller's transaction; after commit each of the
project's webhooks that wants the kind gets a delivery task (``webhook_deliver``, retried
with backoff), and, with ``mail=True``, the project's owners and admins get an email. An
event is never sent for a change that rolled back.
"""

import hashlib
import hmac
import json
import logging

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from controlplane import egress
from controlplane.compiled import Compiled, insert
from controlplane.models import Event, Webhook

log = logging.getLogger(__name__)

#: A project's webhooks, read at every event: compiled once.
_HOOKS = Compiled(lambda project_id: Webhook.objects.for_project(project_id), int)

SIGNATURE_HEADER = "X-Kumo-Signature"


def emit(
    kind: str,
    *,
    project,
    message: str,
    obj=None,
    payload: dict | None = None,
    mail: bool = False,
) -> Event:
    """Record event ``kind`` for ``project`` and deliver it after commit."""
    event = Event(
        project=project,
        kind=kind,
        message=message[:500],
        object_type=obj._meta.label_lower if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        payload=payload or {},
    )
    insert(event)  # built once: evictions and placements emit them by the thousand
    hooks = [h.pk for h in _HOOKS.objects(project.pk) if h.wants(kind)]

    def deliver():
        for hook in hooks:
            webhook_deliver.delay(webhook_id=hook, event_id=event.pk)
        if mail:
            _mail(event)

    transaction.on_commit(deliver, robust=True)
    return event


def body(event: Event) -> bytes:
    """The JSON a webhook receives."""
    return json.dumps(
        {
            "id": event.pk,
            "kind": event.kind,
            "project": event.project.slug,
            "message": event.message,
            "object_type": event.object_type,
            "object_id": event.object_id,
            "payload": event.payload,
            "created_at": event.created_at.isoformat(),
        },
        sort_keys=True,
    ).encode()


def signature(secret: str, data: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def _mail(event: Event) -> None:
    from tenants.choices import Role

    recipients = sorted(
        {
            m.user.email
            for m in event.project.memberships.select_related("user")
            if m.role in (Role.ADMIN, Role.OWNER) and m.user.email
        }
    )
    if not recipients:
        return
    send_mail(
        subject=f"[Kumo] {event.project.slug}: {event.kind}",
        message=event.message,
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=recipients,
        fail_silently=True,
    )


# --- delivery ---------------------------------------------------------------------------

# A failed webhook delivery is tried again this many times in all, after 2, 4, 8 ... seconds
# (at most WEBHOOK_BACKOFF_MAX_S apart).
WEBHOOK_ATTEMPTS = 9
WEBHOOK_BACKOFF_MAX_S = 300


def webhook_retry_in(attempt: int) -> int:
    """Seconds before delivery attempt ``attempt + 1``."""
    return min(2**attempt, WEBHOOK_BACKOFF_MAX_S)


@shared_task(name="kumo.control.webhook_deliver", acks_late=True, time_limit=60)
def webhook_deliver(*, webhook_id: int, event_id: int, attempt: int = 1) -> int:
    """POST one event to one webhook; a network error or a 5xx is tried again with backoff
    (``WEBHOOK_ATTEMPTS``), a 4xx is recorded and not retried (the receiver refused it).
    Each failed delivery is one line in the log, never a traceback: a dead receiver is the
    project's affair, and its last status is on the webhook for them to see. A destination
    ``controlplane.egress`` refuses (not public, not allowed by the operator) gets nothing;
    the refusal is recorded as its status and not retried."""
    import httpx

    hook = Webhook.objects.filter(pk=webhook_id, active=True).first()
    event = Event.objects.select_related("project").filter(pk=event_id).first()
    if hook is None or event is None:
        return 0
    data = body(event)
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: signature(hook.secret, data)}
    try:
        response = egress.post(hook.url, content=data, headers=headers, timeout=10)
        status = str(response.status_code)
    except egress.Refused as e:  # nothing was sent; not retried
        Webhook.objects.filter(pk=hook.pk).update(
            last_delivery_at=timezone.now(), last_status=f"refused: {e.reason}"[:200]
        )
        log.warning("webhook %s of %s: refused: %s", hook.pk, event.project.slug, e.reason)
        return 0
    except httpx.HTTPError as e:
        status = f"error: {e}"[:200]
        response = None
    Webhook.objects.filter(pk=hook.pk).update(last_delivery_at=timezone.now(), last_status=status)
    if response is None or response.status_code >= 500:
        if attempt >= WEBHOOK_ATTEMPTS:
            log.warning(
                "webhook %s event %s: delivery %d of %d failed (%s); given up",
                hook.pk, event.pk, attempt, WEBHOOK_ATTEMPTS, status,
            )  # fmt: skip
        else:
            delay = webhook_retry_in(attempt)
            log.warning(
                "webhook %s event %s: delivery %d of %d failed (%s); next in %d s",
                hook.pk, event.pk, attempt, WEBHOOK_ATTEMPTS, status, delay,
            )  # fmt: skip
            webhook_deliver.apply_async(
                kwargs={"webhook_id": webhook_id, "event_id": event_id, "attempt": attempt + 1},
                countdown=delay,
            )
        return response.status_code if response is not None else 0
    return response.status_code
