"""Operators' pages (staff only) beyond the fleet's hosts: every project with its owner,
status, validity and quota (set through ``tenants.services.quota_set``), and every
project's external connection requests to approve or reject
(``network.services.connection_review``)."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from controlplane.portal.access import form_invalid, staff_page
from controlplane.portal.forms import QUOTA_LABELS, QuotaForm, ReviewForm
from controlplane.portal.views.common import act, page, submit
from network import services as network_services
from network.choices import ConnectionState
from network.models import ExternalConnection
from tenants import services as tenant_services
from tenants.models import Project, Quota


@staff_page
def project_list(request):
    """Every project: slug, owner, status, validity and its limits."""
    projects = Project.objects.select_related("owner", "quota").order_by("slug")
    return page(
        request,
        "portal/operators/projects.html",
        {"projects": projects, "resources": [(r, QUOTA_LABELS[r]) for r in Quota.RESOURCES]},
    )


@staff_page
def project_quota(request, slug):
    """Set a project's limits. Lowering below usage is allowed (the service's rule)."""
    project = get_object_or_404(Project.objects.select_related("quota"), slug=slug)
    form = QuotaForm(request.POST or None, initial=project.quota.limits())
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: tenant_services.quota_set(project=project, **v))
        if ok:
            messages.success(request, _("Quota of %(slug)s saved.") % {"slug": project.slug})
            return redirect("portal:fleet-projects")
    return page(
        request,
        "portal/operators/quota.html",
        {"target": project, "form": form},
        status=status,
    )


@staff_page
def connection_list(request):
    """Every project's connection requests, those waiting first."""
    connections = ExternalConnection.objects.select_related(
        "project", "network", "reviewed_by"
    ).order_by("created_at")
    waiting = [c for c in connections if c.state == ConnectionState.REQUESTED]
    reviewed = [c for c in connections if c.state != ConnectionState.REQUESTED]
    return page(
        request,
        "portal/operators/connections.html",
        {"waiting": waiting, "reviewed": reviewed[::-1]},
    )


@require_POST
@staff_page
def connection_review(request, pk, verdict):
    connection = get_object_or_404(ExternalConnection, pk=pk)
    form = ReviewForm(request.POST)
    if not form.is_valid():
        form_invalid(form)
        messages.error(
            request, _("%(name)s: the note is at most 500 characters.") % {"name": connection.name}
        )
        return redirect("portal:fleet-connections")
    approve = verdict == "approve"
    return act(
        request,
        network_services.connection_review,
        done=(
            _("Connection %(slug)s/%(name)s approved.")
            if approve
            else _("Connection %(slug)s/%(name)s rejected.")
        )
        % {"slug": connection.project.slug, "name": connection.name},
        back=reverse("portal:fleet-connections"),
        connection=connection,
        approve=approve,
        note=form.cleaned_data["note"],
        actor=request.user,
    )
