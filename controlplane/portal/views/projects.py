"""The project list, the project switcher, a project's dashboard and its settings."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from compute.choices import VmState
from compute.models import VirtualMachine
from controlplane.errors import Conflict
from controlplane.models import Event
from controlplane.portal import charts, reports
from controlplane.portal.access import project_page
from controlplane.portal.forms import ProjectSettingsForm
from controlplane.portal.views.common import act, page, submit
from tenants import billing, selectors
from tenants import services as tenant_services
from tenants.choices import Role, UsageResource


@login_required
def home(request):
    """The caller's projects, each leading to its dashboard."""
    projects = selectors.projects_for(request.user).order_by("slug")
    return page(request, "portal/home.html", {"projects": projects})


@login_required
def switch(request):
    """The switcher's target: the chosen project's dashboard (a project the caller has no
    role in answers 404 there)."""
    slug = request.GET.get("project", "")
    if not slug:
        return redirect("portal:home")
    return redirect("portal:dashboard", slug=slug)


def month_spend(project, now):
    """The month's spend so far and projected, or None without a rate card to price it."""
    if billing.rate_card_at(now) is None:
        return None
    try:
        return billing.forecast(project, now=now)
    except Conflict:  # a resource the card does not price: no honest figure to show
        return None


@project_page()
def dashboard(request, project):
    """Quota use, VMs by state, GPU-hours and spend this month, with GPU-hours by day."""
    now = timezone.now()
    live = VirtualMachine.objects.for_project(project).exclude(state=VmState.DELETED)
    states = {}
    for state in live.values_list("state", flat=True):
        states[state] = states.get(state, 0) + 1
    gpu_days = reports.usage_by_day(project, UsageResource.GPU, now)
    quota = selectors.quota_report(project)
    for row in quota.values():
        row["percent"] = min(100, round(100 * row["used"] / row["limit"])) if row["limit"] else 0
    return page(
        request,
        "portal/dashboard.html",
        {
            "quota": quota,
            "states": sorted(states.items()),
            "running": states.get(VmState.RUNNING, 0),
            "gpu_hours": sum(v for _, v in gpu_days),
            "gpu_chart": charts.bars(
                [(f"{d:%d}", v) for d, v in gpu_days],
                unit="GPU-h",
                title=_("GPU-hours per day this month"),
            ),
            "spend": month_spend(project, now),
            "events": Event.objects.for_project(project).order_by("-created_at")[:8],
            "month": now,
        },
        project=project,
    )


SETTINGS_FIELDS = ("name", "description", "valid_from", "valid_until")


@project_page(write_role=Role.ADMIN)
def project_settings(request, project):
    """Name, description and validity (admins, what the API's project PATCH changes),
    through ``tenants.services.project_update``."""
    initial = {name: getattr(project, name) for name in SETTINGS_FIELDS}
    form = ProjectSettingsForm(request.POST or None, initial=initial)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: tenant_services.project_update(project=project, **v))
        if ok:
            messages.success(request, _("Project settings saved."))
            return redirect("portal:project-settings", slug=project.slug)
    return page(request, "portal/settings.html", {"form": form}, project=project, status=status)


@require_POST
@project_page(write_role=Role.OWNER)
def project_delete(request, project):
    """Its owner deletes the project, through ``tenants.services.project_delete``: only one
    that holds nothing and was never billed. A refusal (what it still holds, or that its
    bills are kept and it ends with its validity) is said on the settings page, audited."""
    return act(
        request,
        tenant_services.project_delete,
        done=_("Project %(slug)s deleted.") % {"slug": project.slug},
        back=reverse("portal:project-settings", kwargs={"slug": project.slug}),
        gone=reverse("portal:home"),
        project=project,
    )
