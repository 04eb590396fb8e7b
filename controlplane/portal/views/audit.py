"""The project's audit trail, newest first, a page at a time, filtered by action, user,
object (its type, id or name) and outcome; a refused action shows why it was refused. And
its event feed (what webhooks receive: evictions, leases, budgets, approvals), filtered by
kind and object the same way."""

from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import Q

from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent, Event
from controlplane.portal.access import project_page
from controlplane.portal.views.common import page

PAGE_SIZE = 50
FILTERS = ("action", "user", "object", "outcome")
EVENT_FILTERS = ("kind", "object")


def _asked(request, filters) -> dict[str, str]:
    return {name: request.GET.get(name, "").strip()[:200] for name in filters}


def _listing(request, project, template, rows, asked, **context):
    """A page of ``rows``, newest first, with the filters ``asked`` kept in its links."""
    return page(
        request,
        template,
        {
            "page": Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page")),
            "query": urlencode({k: v for k, v in asked.items() if v}),
            "asked": asked,  # not spread: "user" is the layout's logged-in user
            **context,
        },
        project=project,
    )


def _object(q: str) -> Q:
    """An object by its type (``network``, or ``compute.virtualmachine`` whole) or its id."""
    return Q(object_type__iexact=q) | Q(object_type__iendswith=f".{q}") | Q(object_id=q)


@project_page()
def audit_log(request, project):
    events = AuditEvent.objects.for_project(project)
    asked = _asked(request, FILTERS)
    if asked["action"]:
        events = events.filter(action__startswith=asked["action"])
    if asked["user"]:
        events = events.filter(actor_name__iexact=asked["user"])
    if asked["object"]:
        events = events.filter(_object(asked["object"]) | Q(object_repr__icontains=asked["object"]))
    if asked["outcome"] in AuditOutcome.values:
        events = events.filter(outcome=asked["outcome"])
    else:
        asked["outcome"] = ""
    return _listing(
        request, project, "portal/audit.html", events, asked, outcomes=AuditOutcome.choices
    )


@project_page()
def event_feed(request, project):
    events = Event.objects.for_project(project)
    asked = _asked(request, EVENT_FILTERS)
    if asked["kind"]:
        events = events.filter(kind__startswith=asked["kind"])
    if asked["object"]:
        events = events.filter(_object(asked["object"]))
    return _listing(request, project, "portal/events.html", events, asked)
