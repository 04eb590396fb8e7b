"""Cross-cutting records: the audit trail, asynchronous operations, idempotency keys."""

import uuid

from django.conf import settings
from django.db import models

from controlplane.choices import AuditOutcome, AuditSource, OperationState
from controlplane.querysets import ProjectOwnedQuerySet


class AuditEvent(models.Model):
    """One mutation, attempted or done: who, what, on which object, when, from where, and
    how it ended. Written in the same transaction as the change it records."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, help_text="kept when the user is deleted")
    source = models.CharField(max_length=16, choices=AuditSource.choices)
    action = models.CharField(max_length=64, db_index=True, help_text="e.g. project.create")
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    project = models.ForeignKey(
        "tenants.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    project_slug = models.CharField(max_length=40, blank=True, help_text="kept when deleted")
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=AuditOutcome.choices)
    detail = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=64, blank=True)

    objects = ProjectOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["project", "-at"], name="audit_project_at")]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.outcome}"


class Operation(models.Model):
    """Work the API accepted (202) and a worker or a host agent carries out.

    Clients poll ``/operations/{id}``; the reaper fails an operation still unfinished past
    ``deadline_at`` so nothing waits forever on a lost message.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(
        "tenants.Project", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    kind = models.CharField(max_length=64, help_text="e.g. host.ping, vm.create")
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    state = models.CharField(
        max_length=16, choices=OperationState.choices, default=OperationState.PENDING
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deadline_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)

    objects = ProjectOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["project", "-created_at"], name="operation_project_at"),
            models.Index(fields=["state", "deadline_at"], name="operation_open_deadline"),
            # A VM's current operation (``compute.services.lifecycle.current_operation``,
            # at every report of its host): its own few, not every failed one of the cloud's
            # history.
            models.Index(
                fields=["target_type", "target_id", "-created_at"], name="operation_target_at"
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.target_type}/{self.target_id} {self.state}"


class IdempotencyKey(models.Model):
    """The first successful response to a POST sent with an ``Idempotency-Key`` header.

    A retry with the same key (same user, same method and path, same body) gets this
    response again instead of a second object; the same key with another request is a 422.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of method, path and body")
    status_code = models.PositiveSmallIntegerField(null=True)
    response = models.JSONField(null=True)
    location = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="unique_idempotency_key")
        ]

    def __str__(self):
        return f"{self.user_id}:{self.key}"


class Event(models.Model):
    """Something a project should hear about: a spot VM's eviction notice, a budget
    threshold crossed, a reclamation step announced. Listed in the API, delivered to the
    project's webhooks and, for the ones that say so, mailed to its admins
    (``controlplane.events.emit``)."""

    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=64, db_index=True, help_text="e.g. vm.eviction_notice")
    message = models.CharField(max_length=500)
    object_type = models.CharField(max_length=64, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = ProjectOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "-created_at"], name="event_project_at")]

    def __str__(self):
        return f"{self.kind}: {self.message}"


class Webhook(models.Model):
    """A project's endpoint for its events: every event whose kind is in ``kinds`` (all
    when empty) is POSTed to ``url`` as JSON, signed with HMAC-SHA256 of ``secret``
    (header ``X-Kumo-Signature: sha256=<hex>``), retried with backoff on failure."""

    project = models.ForeignKey(
        "tenants.Project", on_delete=models.CASCADE, related_name="webhooks"
    )
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=64)
    kinds = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_delivery_at = models.DateTimeField(null=True, blank=True)
    last_status = models.CharField(max_length=200, blank=True)

    objects = ProjectOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]

    def __str__(self):
        return self.url

    def wants(self, kind: str) -> bool:
        return self.active and (not self.kinds or kind in self.kinds)
