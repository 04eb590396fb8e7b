"""Invitations, project applications, users as operators see them, and institutional
reviewers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any


@dataclass(frozen=True)
class Invitation:
    """An invitation to the project by e-mail (its secret only travels in the mail)."""

    id: int = 0
    email: str = ""
    role: str = ""
    status: str = ""
    invited_by: str | None = None
    expires_at: datetime | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Application:
    """A project application: new project, renewal or quota increase."""

    id: int = 0
    kind: str = ""
    state: str = ""
    applicant: str = ""
    project: str | None = None
    slug: str = ""
    title: str = ""
    purpose: str = ""
    field: str = ""
    vcpus: int = 0
    memory_gib: int = 0
    gpus: int = 0
    storage_gib: int = 0
    global_ips: int = 0
    valid_from: date | None = None
    valid_until: date | None = None
    review_comment: str = ""
    reviewed_by: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Identity:
    id: int = 0
    kind: str = ""
    issuer: str = ""
    subject: str = ""
    last_login_at: datetime | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class OperatorUser:
    """A user as operators see them, with their federated identities."""

    id: int = 0
    username: str = ""
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    display_name: str = ""
    organisation: str = ""
    affiliation: str = ""
    is_staff: bool = False
    is_active: bool = True
    has_password: bool = False
    date_joined: datetime | None = None
    last_login: datetime | None = None
    identities: list[Identity] = dataclasses.field(default_factory=list)
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class InstitutionReviewer:
    """``user`` reviews the applications of applicants with an identity at ``issuer`` (an
    IdP's entity ID or an OIDC issuer)."""

    id: int = 0
    user: str = ""
    issuer: str = ""
    created_by: str | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
