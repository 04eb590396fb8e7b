"""Placement groups: the project's groups with their VMs, making one (affinity,
anti-affinity, compact) and deleting an empty one, through ``compute.services``."""

from django.contrib import messages
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from compute import services
from compute.choices import VmState
from compute.models import PlacementGroup
from controlplane.portal.access import project_page
from controlplane.portal.forms import PlacementGroupForm
from controlplane.portal.views.common import act, page, submit


@project_page()
def placement_groups(request, project):
    form = PlacementGroupForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.placement_group_create(project=project, **v))
        if ok:
            messages.success(
                request,
                _("Placement group %(name)s created.") % {"name": form.cleaned_data["name"]},
            )
            return redirect("portal:placement-groups", slug=project.slug)
    groups = (
        PlacementGroup.objects.for_project(project)
        .annotate(members=Count("vms", filter=~Q(vms__state=VmState.DELETED)))
        .order_by("name")
    )
    return page(
        request,
        "portal/placement_groups.html",
        {"groups": groups, "form": form},
        project=project,
        status=status,
    )


@require_POST
@project_page()
def placement_group_delete(request, project, pk):
    group = get_object_or_404(PlacementGroup.objects.for_project(project), pk=pk)
    return act(
        request,
        services.placement_group_delete,
        done=_("Placement group %(name)s deleted.") % {"name": group.name},
        back=reverse("portal:placement-groups", kwargs={"slug": project.slug}),
        group=group,
    )
