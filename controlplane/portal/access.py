"""Who may see and change what in the portal, and how refusals and service errors look.

The same rules as the API (``controlplane.api.viewsets``), applied once here:

- ``project_page`` resolves the project through the caller's membership
  (``tenants.selectors.membership_for``): no role there answers the 404 page, exactly like
  a missing project. A write (any method but GET/HEAD) below the page's ``write_role``
  answers the 403 page naming the role needed, and is audited as denied.
- ``staff_page``: operators only; anyone else gets the 404 page.
- ``form_error`` puts a service's ``KumoError`` on a form, under the field it names.
"""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane import audit
from controlplane.choices import AuditOutcome
from controlplane.errors import KumoError
from tenants.choices import Role
from tenants.selectors import membership_for

SAFE_METHODS = ("GET", "HEAD")


def refuse(request, status: int, message: str):
    """The error page: 403 (not allowed) or 404 (nothing there for you)."""
    title = {403: "Not allowed", 404: "Not found"}.get(status, "Refused")
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
                return refuse(request, 404, f"You have no project named {slug!r}.")
            request.membership = membership
            if request.method not in SAFE_METHODS and not Role.at_least(
                membership.role, write_role
            ):
                message = (
                    f"Your role in project {slug} is {membership.role}; "
                    f"this needs {write_role} or above."
                )
                audit.record(
                    f"portal.{view.__name__}",
                    project=membership.project,
                    outcome=AuditOutcome.DENIED,
                    detail={"status": 403, "path": request.path, "message": message},
                )
                return refuse(request, 403, message)
            return view(request, membership.project, *args, **kwargs)

        return wrapper

    return decorate


def staff_page(view):
    """Operators only: anyone else gets the 404 page (the page does not exist for them)."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_staff:
            return refuse(request, 404, "There is no such page.")
        return view(request, *args, **kwargs)

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
    return error.status
