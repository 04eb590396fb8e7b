"""Who may see and change what in the portal, and how refusals and service errors look.

The same rules as the API (``controlplane.api.viewsets``), applied once here:

- ``project_page`` resolves the project through the caller's membership
  (``tenants.selectors.membership_for``): no role there answers the 404 page, exactly like
  a missing project. A write (any method but GET/HEAD) below the page's ``write_role``
  answers the 403 page naming the role needed, and is audited as denied.
- ``staff_page``: operators only; anyone else gets the 404 page.
- ``form_error`` puts a service's ``KumoError`` on a form, under the field it names.
- ``record_refusal``: a write the portal refused (bad input 400, a conflict 409, …) is
  audited like the API's refused writes (``controlplane.api.errors``): action
  ``portal.<view>``, outcome ``failed`` (``denied`` for 403/404), detail ``{status, code,
  message}``, in the page's project.

Refusal pages speak the visitor's language; what the audit log records stays English
(``LANGUAGE_CODE``), like the API's messages.
"""

import contextvars
import logging
from dataclasses import dataclass
from functools import wraps

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404
from django.shortcuts import render
from django.utils import translation
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import KumoError
from tenants.choices import Role
from tenants.selectors import membership_for

SAFE_METHODS = ("GET", "HEAD")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PageContext:
    """What a refusal on the current page is recorded under."""

    action: str
    project: object | None = None


_page: contextvars.ContextVar[PageContext | None] = contextvars.ContextVar(
    "kumo_portal_page", default=None
)


def _run(view, request, project, *args, **kwargs):
    """Call ``view`` with the page context set (so ``record_refusal`` knows the page)."""
    token = _page.set(PageContext(action=f"portal.{view.__name__}", project=project))
    try:
        if project is None:
            return view(request, *args, **kwargs)
        return view(request, project, *args, **kwargs)
    except Http404:
        # A write aimed at nothing (or at another project's object) is a denied write, as
        # in the API; the answer stays the plain 404 page.
        if request.method not in SAFE_METHODS:
            record_refusal(404, "not_found", "Not found.", details={"path": [request.path]})
        raise
    finally:
        _page.reset(token)


def record_refusal(
    status: int, code: str, message: str, *, obj=None, details: dict | None = None
) -> None:
    """Audit a write the current page refused, the way the API audits its refusals.

    Outside a page (no context) nothing is recorded. Never raises: auditing a refusal must
    not turn a 4xx into a 500."""
    ctx = _page.get()
    if ctx is None:
        return
    detail = {"status": status, "code": code, "message": message}
    if details:
        detail["details"] = {
            str(k): [str(r) for r in v] if isinstance(v, list | tuple) else [str(v)]
            for k, v in details.items()
        }
    try:
        with transaction.atomic():  # a savepoint: a failure here leaves the request's alone
            audit.record(
                ctx.action,
                obj,
                project=ctx.project,
                outcome=AuditOutcome.DENIED if status in (403, 404) else AuditOutcome.FAILED,
                detail=detail,
            )
    except Exception:
        log.exception("could not audit a refused %s", ctx.action)


def refuse(request, status: int, message: str):
    """The error page: 403 (not allowed) or 404 (nothing there for you)."""
    title = {403: _("Not allowed"), 404: _("Not found")}.get(status, _("Refused"))
    return render(
        request, "portal/refused.html", {"title": title, "message": message}, status=status
    )


def project_page(write_role: str = Role.MEMBER):
    """Decorate ``view(request, project, *args)`` of ``/p/<slug>/…``: membership resolved,
    role checked; ``request.membership`` holds the caller's membership."""

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapper(request, slug, *args, **kwargs):
            membership = membership_for(request.user, slug)
            if membership is None:
                return refuse(
                    request, 404, _("You have no project named %(slug)s.") % {"slug": repr(slug)}
                )
            request.membership = membership
            if request.method not in SAFE_METHODS and not Role.at_least(
                membership.role, write_role
            ):
                said = {"slug": slug, "role": membership.role, "needed": write_role}
                message = gettext_noop(
                    "Your role in project %(slug)s is %(role)s; this needs %(needed)s or above."
                )
                audit.record(
                    f"portal.{view.__name__}",
                    project=membership.project,
                    outcome=AuditOutcome.DENIED,
                    detail={"status": 403, "path": request.path, "message": message % said},
                )
                return refuse(request, 403, _(message) % said)
            return _run(view, request, membership.project, *args, **kwargs)

        return wrapper

    return decorate


def staff_page(view):
    """Operators only: anyone else gets the 404 page (the page does not exist for them)."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_staff:
            return refuse(request, 404, _("There is no such page."))
        return _run(view, request, None, *args, **kwargs)

    return wrapper


def may_write(request, role: str = Role.MEMBER) -> bool:
    """Whether the caller's role in the current project reaches ``role`` (to hide forms)."""
    membership = getattr(request, "membership", None)
    return membership is not None and Role.at_least(membership.role, role)


def form_error(form, error: KumoError) -> int:
    """Put ``error`` on ``form``: its message goes under the first field it names that the
    form has, else at the top of the form. Returns the HTTP status to answer with."""
    field = next((name for name in error.details if name in form.fields), None)
    form.add_error(field, error.message)
    record_refusal(error.status, error.code, error.message, details=error.details)
    return error.status


def form_invalid(form) -> int:
    """Audit a form refused as invalid input (400): the first field and its reason in the
    message, every field's reasons in the details. Returns 400."""
    with translation.override(settings.LANGUAGE_CODE):  # the audit log stays English
        errors = form.errors.get_json_data()
        field, reasons = next(iter(errors.items()), ("__all__", [{"message": "Invalid input."}]))
        label = str(form[field].label) if field in form.fields else ""
    reason = reasons[0]["message"] if reasons else "Invalid input."
    record_refusal(
        400,
        "invalid",
        f"{label}: {reason}" if label else reason,
        details={name: [r["message"] for r in rs] for name, rs in errors.items()},
    )
    return 400
