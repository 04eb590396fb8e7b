"""The audit trail: who did what to which object, when, from where, and how it ended.

Services call ``record()`` inside their transaction, so an event commits with its change or
not at all. Who and from where come from the audit context: the middleware opens one per
request (source ``api``, ``portal`` or ``admin``), the controller opens one per task
(``controller``), management commands one of their own (``system``). This is NetBox's
change-logging context, kept small.

An event is written with nearly every change Kumo makes (a VM's life writes eight or nine),
so ``record`` does not go through ``Model.save``, which builds and compiles the same
``INSERT`` each time: it runs that ``INSERT``, built once from the model's fields
(``controlplane.compiled.insert``; on PostgreSQL, prepared as the settings prepare every
statement a connection runs again: ``controlplane.prepared``).
"""

import contextvars
import functools
import ipaddress
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, replace

from django.conf import settings

from controlplane.choices import AuditOutcome, AuditSource
from controlplane.compiled import insert, insert_many


@dataclass(frozen=True)
class AuditContext:
    actor: object | None = None  # a User, or None for the controller and the system
    source: str = AuditSource.SYSTEM
    ip_address: str | None = None
    request_id: str = ""
    actor_name: str = ""  # who acted when no user did ("scheduler"); the source otherwise


_EMPTY = AuditContext()
_context: contextvars.ContextVar[AuditContext] = contextvars.ContextVar(
    "kumo_audit_context", default=_EMPTY
)


def current() -> AuditContext:
    return _context.get()


#: The events ``record`` keeps inside ``batched`` blocks, for the outermost one to write.
_batch: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "kumo_audit_batch", default=None
)


@contextmanager
def batched():
    """Inside the block, ``record`` keeps the events it makes, and the block's end writes
    them all in one ``INSERT`` (``controlplane.compiled.insert_many``): a host's report
    that moves a VM and finishes its operation records both with one statement. A block
    inside another is the outer one's. Used inside the transaction of the same service,
    so that an exception that leaves the block, and writes nothing, rolls back the change
    the events were about as well."""
    if _batch.get() is not None:
        yield
        return
    token = _batch.set([])
    try:
        yield
        events = _batch.get()
    finally:
        _batch.reset(token)
    insert_many(events)


@contextmanager
def audit_context(**fields):
    """Run a block with these audit fields (actor, source, ip_address, request_id)."""
    token = _context.set(replace(_context.get(), **fields))
    try:
        yield _context.get()
    finally:
        _context.reset(token)


@contextmanager
def controller():
    """Run a block as the controller: Kumo's own work, no user (beat's tasks, host
    reports, operations finished by a host's answer)."""
    with audit_context(source=AuditSource.CONTROLLER, actor=None) as ctx:
        yield ctx


def as_controller(task):
    """A controller task's whole body runs as the controller (``controller``)."""

    @functools.wraps(task)
    def run(*args, **kwargs):
        with controller():
            return task(*args, **kwargs)

    return run


@contextmanager
def acting_as(name: str):
    """Run a block as Kumo itself (``name``, e.g. ``"scheduler"``): no user, no address, no
    request id. For work a request does in *another* project's name (the on-demand VM of
    project B that gives project A's spot VM its eviction notice): a record in one
    project's trail never carries another project's user, address or request."""
    with audit_context(
        actor=None, actor_name=name, source=AuditSource.CONTROLLER, ip_address=None, request_id=""
    ) as ctx:
        yield ctx


def set_actor(user) -> None:
    """Name the actor once authentication has run (DRF authenticates inside the view)."""
    _context.set(replace(_context.get(), actor=user))


def record(
    action: str,
    obj=None,
    *,
    project=None,
    outcome: str = AuditOutcome.SUCCESS,
    detail: dict | None = None,
    object_type: str | None = None,
    object_id: str | None = None,
    object_repr: str | None = None,
):
    """Write one audit event for ``action`` on ``obj`` in the current audit context."""
    from controlplane.models import AuditEvent

    ctx = current()
    actor = ctx.actor if getattr(ctx.actor, "is_authenticated", False) else None
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id if object_id is not None else str(obj.pk)
        object_repr = object_repr if object_repr is not None else str(obj)[:200]
    event = AuditEvent(
        actor=actor,
        actor_name=actor.get_username() if actor else (ctx.actor_name or ctx.source),
        source=ctx.source,
        action=action,
        object_type=object_type or "",
        object_id=object_id or "",
        object_repr=(object_repr or "")[:200],
        project=project,
        project_slug=project.slug if project is not None else "",
        ip_address=ctx.ip_address,
        outcome=outcome,
        detail=detail or {},
        request_id=ctx.request_id,
    )
    kept = _batch.get()
    if kept is None:
        insert(event)
    else:
        kept.append(event)  # written at the end of the batch (``batched``)
    return event


def client_ip(request) -> str | None:
    """The client's address: the socket peer, or with ``KUMO_TRUSTED_PROXY_COUNT`` proxies in
    front, the address that many hops from the right of X-Forwarded-For."""
    address = request.META.get("REMOTE_ADDR")
    hops = settings.TRUSTED_PROXY_COUNT
    if hops > 0:
        forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [a for a in forwarded if a]
        if len(forwarded) >= hops:
            address = forwarded[-hops]
    try:
        return str(ipaddress.ip_address(address)) if address else None
    except ValueError:
        return None


def source_for_path(path: str) -> str:
    if path.startswith("/api/"):
        return AuditSource.API
    if path.startswith("/admin/"):
        return AuditSource.ADMIN
    return AuditSource.PORTAL


class AuditContextMiddleware:
    """Opens the audit context of a request: source from the path, address, request id."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request.META.get("HTTP_X_REQUEST_ID", "")[:64] or uuid.uuid4().hex
        user = getattr(request, "user", None)
        with audit_context(
            actor=user if getattr(user, "is_authenticated", False) else None,
            source=source_for_path(request.path),
            ip_address=client_ip(request),
            request_id=request_id,
        ):
            response = self.get_response(request)
        response["X-Request-ID"] = request_id
        return response
