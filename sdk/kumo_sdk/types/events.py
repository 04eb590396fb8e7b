"""Operations, events, the audit trail and webhooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Operation:
    """Asynchronous work: ``state`` runs pending → running → succeeded or failed."""

    id: str
    state: str
    kind: str = ""
    url: str = ""
    target_type: str = ""
    target_id: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deadline_at: datetime | None = None
    finished_at: datetime | None = None
    result: dict[str, Any] = field(default_factory=dict)
    error_code: str = ""
    error_message: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")


@dataclass(frozen=True)
class Event:
    """Something that happened in the project (also sent to its webhooks)."""

    id: int = 0
    kind: str = ""
    message: str = ""
    object_type: str = ""
    object_id: str = ""
    payload: Any | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class AuditEvent:
    """One record of the audit trail: who did what to which object, and the outcome."""

    id: int = 0
    at: datetime | None = None
    actor: str = ""
    source: str = ""
    action: str = ""
    object_type: str = ""
    object_id: str = ""
    object_repr: str = ""
    project: str = ""
    ip_address: str | None = None
    outcome: str = ""
    detail: Any | None = None
    request_id: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Webhook:
    """A webhook of the project. ``secret`` (to check signatures) is set only in the answer
    that created it."""

    id: int = 0
    url: str = ""
    kinds: Any | None = None
    active: bool = False
    created_at: datetime | None = None
    last_delivery_at: datetime | None = None
    last_status: str = ""
    secret: str | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
