"""The project's audit trail, newest first, a page at a time."""

from django.core.paginator import Paginator

from controlplane.models import AuditEvent
from controlplane.portal.access import project_page
from controlplane.portal.views.common import page

PAGE_SIZE = 50


@project_page()
def audit_log(request, project):
    events = AuditEvent.objects.for_project(project)
    action = request.GET.get("action", "").strip()
    if action:
        events = events.filter(action__startswith=action)
    return page(
        request,
        "portal/audit.html",
        {
            "page": Paginator(events, PAGE_SIZE).get_page(request.GET.get("page")),
            "action": action,
        },
        project=project,
    )
