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

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction

from controlplane.models import Event, Webhook

log = logging.getLogger(__name__)

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
    event = Event.objects.create(
        project=project,
        kind=kind,
        message=message[:500],
        object_type=obj._meta.label_lower if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        payload=payload or {},
    )
    hooks = [h.pk for h in Webhook.objects.for_project(project) if h.wants(kind)]

    def deliver():
        from controlplane.tasks import webhook_deliver

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
