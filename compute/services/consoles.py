"""The interactive serial console: tokens issued to a user for one VM, and redeemed by the
console proxy (``compute.consoleproxy``), which alone connects to the guest.

A token is a random secret (only its SHA-256 is stored, as API tokens), bound to one VM,
one user and the host the VM ran on when it was issued, usable once within
``KUMO_CONSOLE_TOKEN_TTL_S``. Redeeming it checks everything again at connect time: the
user still active and still a member of the VM's project with a role that may operate
VMs, the VM still running on that same host.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from compute.choices import VmState
from compute.models import ConsoleToken, Host, VirtualMachine
from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import Conflict, KumoError
from tenants.choices import Role
from tenants.models import Membership

# The role that may open a VM's console: the one that may operate VMs (start, reset, ...).
CONSOLE_ROLE = Role.MEMBER


class ConsoleRefused(KumoError):
    """The proxy refuses a connection: the reason is shown to the client, and audited."""

    status = 403
    code = "console_refused"


@dataclass(frozen=True)
class ConsoleTicket:
    """What the API answers: the websocket URL (with the token), the token, its expiry."""

    url: str
    token: str
    expires_at: datetime


@dataclass(frozen=True)
class ConsoleTarget:
    """What the proxy connects to once a token is redeemed."""

    vm_id: str
    host: str
    libvirt_uri: str
    user_id: int
    token_id: int


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def console_libvirt_uri(host: Host) -> str:
    """How the proxy reaches ``host``'s libvirt: ``KUMO_CONSOLE_LIBVIRT_URI`` with the
    host's name, or the URI its agent reports."""
    if settings.CONSOLE_LIBVIRT_URI:
        return settings.CONSOLE_LIBVIRT_URI.format(host=host.name)
    return host.libvirt_uri


def console_url(vm_id, token: str) -> str:
    """The proxy's websocket URL for ``vm_id``'s console with ``token``."""
    base = settings.CONSOLE_PROXY_URL.rstrip("/")
    return f"{base}/vms/{vm_id}/?{urlencode({'token': token})}"


def _console_conflict(vm: VirtualMachine) -> Conflict | None:
    """Why ``vm`` has no console to open now; None when it has one."""
    if vm.state != VmState.RUNNING or vm.host_id is None:
        return Conflict(
            f"vm {vm.name} is {vm.state}: only a running VM has a console to open",
            code="invalid_state",
            details={"state": [vm.state]},
        )
    uri = console_libvirt_uri(vm.host)
    if not uri:
        return Conflict(
            f"vm {vm.name} runs on host {vm.host.name}, whose libvirt the console proxy "
            "cannot reach: its agent reported no libvirt URI and KUMO_CONSOLE_LIBVIRT_URI "
            "is not set",
            code="console_unavailable",
            details={"host": [vm.host.name]},
        )
    if uri.startswith("test:"):
        return Conflict(
            f"vm {vm.name} runs on host {vm.host.name}, a simulated host (libvirt's test "
            "driver), which has no serial console to open",
            code="console_unavailable",
            details={"host": [vm.host.name]},
        )
    return None


@transaction.atomic
def console_token_issue(*, vm: VirtualMachine, user) -> ConsoleTicket:
    """A token for ``user`` to open ``vm``'s serial console once, within
    ``KUMO_CONSOLE_TOKEN_TTL_S``. 409 unless the VM is running on a real host. The token
    itself is returned here only; the database keeps its digest."""
    if problem := _console_conflict(vm):
        raise problem
    token = secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(seconds=settings.CONSOLE_TOKEN_TTL_S)
    row = ConsoleToken.objects.create(
        project=vm.project,
        digest=token_digest(token),
        vm=vm,
        user=user,
        host_id=vm.host_id,
        expires_at=expires_at,
    )
    audit.record(
        "vm.console",
        vm,
        project=vm.project,
        detail={"token": row.pk, "host": vm.host.name, "expires_at": expires_at.isoformat()},
    )
    return ConsoleTicket(url=console_url(vm.pk, token), token=token, expires_at=expires_at)


def console_token_redeem(token: str, *, vm_id: str, session_user_id: int | None = None):
    """Redeem ``token`` for the console of ``vm_id`` (the VM the client's URL names): the
    target to connect to, or ``ConsoleRefused`` with the reason.

    Refused: an unknown (or tampered) token, an expired or already used one, one issued for
    another VM, one presented with the session of another user (a browser sends the
    portal's session cookie along), a user no longer active or no longer a member allowed
    to operate VMs in the VM's project, a VM no longer running or no longer on the host it
    was on. The token is spent by the attempt whatever the
    outcome; every outcome is audited as ``vm.console_connect``."""
    if not token or len(token) > 128:
        raise ConsoleRefused("token: missing or malformed", details={"token": ["missing"]})
    now = timezone.now()
    with transaction.atomic():
        row = (
            ConsoleToken.objects.select_related("user", "project", "host")
            .filter(digest=token_digest(token))
            .first()
        )
        if row is None:
            raise ConsoleRefused("token: unknown", details={"token": ["unknown"]})
        claimed = ConsoleToken.objects.filter(
            pk=row.pk, used_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
        vm = VirtualMachine.objects.select_related("host", "project").get(pk=row.vm_id)
        with audit.audit_context(actor=row.user):
            reason = _refusal(row, vm, claimed=bool(claimed), vm_id=vm_id, now=now,
                              session_user_id=session_user_id)  # fmt: skip
            audit.record(
                "vm.console_connect",
                vm,
                project=vm.project,
                outcome=AuditOutcome.DENIED if reason else AuditOutcome.SUCCESS,
                detail={"token": row.pk, "host": row.host.name, "reason": reason or ""},
            )
    if reason:
        raise ConsoleRefused(reason)
    return ConsoleTarget(
        vm_id=str(vm.pk),
        host=vm.host.name,
        libvirt_uri=console_libvirt_uri(vm.host),
        user_id=row.user_id,
        token_id=row.pk,
    )


def _refusal(row, vm, *, claimed, vm_id, now, session_user_id) -> str:
    """Why the redeeming of ``row`` is refused; empty when it is not."""
    if not claimed:
        return "token: used already" if row.used_at else "token: expired"
    try:
        asked = uuid.UUID(str(vm_id))
    except ValueError:
        return "vm: not a VM id"
    if asked != vm.pk:
        return "token: issued for another VM"
    if session_user_id is not None and session_user_id != row.user_id:
        return "token: issued to another user"
    if not row.user.is_active:
        return "user: no longer active"
    role = (
        Membership.objects.filter(project=vm.project, user=row.user)
        .values_list("role", flat=True)
        .first()
    )
    if not Role.at_least(role, CONSOLE_ROLE):
        return "user: no longer a member allowed to operate this project's VMs"
    if vm.state != VmState.RUNNING:
        return f"vm: {vm.state}, not running"
    if vm.host_id != row.host_id:
        return "vm: no longer on the host the token was issued for"
    return ""
