"""The operators' fleet view (staff only): every host in one table (state, capacity and
use, labels, heartbeat), hosts by state with each host's GPUs as a grid (free, on demand,
spot), and drain / maintenance / return to service through
``compute.services.host_set_state``."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from compute import services
from compute.models import Host
from controlplane.errors import KumoError
from controlplane.portal import reports
from controlplane.portal.access import form_invalid, record_refusal, staff_page
from controlplane.portal.forms import HostStateForm
from controlplane.portal.views.common import page


@staff_page
def fleet(request):
    groups = reports.fleet()
    cells = [cell for rows in groups.values() for row in rows for cell in row.gpus]
    totals = {"gpus": len(cells)}
    for kind in ("free", "on_demand", "spot"):
        totals[kind] = sum(1 for cell in cells if cell.occupancy == kind)
    hosts = sorted((row.host for rows in groups.values() for row in rows), key=lambda h: h.name)
    return page(
        request,
        "portal/fleet.html",
        {"groups": groups, "totals": totals, "hosts": hosts, "state_form": HostStateForm()},
    )


@require_POST
@staff_page
def host_state(request, name):
    host = get_object_or_404(Host, name=name)
    form = HostStateForm(request.POST)
    if not form.is_valid():
        form_invalid(form)
        messages.error(
            request,
            _("%(name)s: choose drain, maintenance or return to service.") % {"name": host.name},
        )
        return redirect("portal:fleet")
    try:
        host = services.host_set_state(host=host, **form.cleaned_data)
    except KumoError as e:
        record_refusal(e.status, e.code, e.message, obj=host, details=e.details)
        messages.error(request, f"{host.name}: {e.message}")
    else:
        messages.success(
            request, _("%(name)s is %(state)s.") % {"name": host.name, "state": host.state}
        )
    return redirect("portal:fleet")
