"""Events, the audit trail and webhooks of a project."""

from __future__ import annotations

from kumo_sdk.resource import CREATE, DELETE, READ, Resource
from kumo_sdk.types import AuditEvent, Event, Webhook


class Events(Resource[Event]):
    """What happened in the project (VM state changes, eviction notices, budget alerts)."""

    path, type, find_by = "events/", Event, None


class AuditEvents(Resource[AuditEvent]):
    """The project's audit trail: every change and every refused one, who, when, outcome."""

    path, type, find_by, noun = "audit-events/", AuditEvent, None, "audit event"


class Webhooks(Resource[Webhook]):
    """``create(url, kinds=[...])``: events of those kinds (all when empty) are POSTed to
    ``url``, signed with the ``secret`` shown in that answer only."""

    path, type, find_by, create_args = "webhooks/", Webhook, "url", ("url",)
    verbs = READ | {CREATE, DELETE}
