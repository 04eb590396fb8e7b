"""Leases (``compute.services.leases``): a project's reservations of GPUs as a timeline
over the coming days, reserving (admins: a lease is billed whether used or not; a lease
the fleet cannot hold shows the earliest period that fits), cancelling, lending idle GPUs
or keeping them, moving the end or changing the size (later or more is admitted again; a
refusal names the latest end or the most GPUs that fit); and the operators' calendar of every
project's leases over the next 30 days."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from compute import guarantees, services
from compute.leases import HOLDING
from compute.models import Lease
from controlplane.errors import Conflict, InvalidInput, KumoError
from controlplane.portal.access import form_error, project_page, staff_page
from controlplane.portal.forms import LeaseForm
from controlplane.portal.views.common import act, page
from tenants.choices import Role

PROJECT_DAYS = 14  # the project page's timeline
FLEET_DAYS = 30  # the operators' calendar
RECENT = timedelta(days=7)  # leases over this long ago leave the project's page


@dataclass(frozen=True)
class Row:
    """One lease on a timeline: its bar's offset and width, in percent of the window."""

    lease: Lease
    end: datetime
    left: float
    width: float


def timeline(leases, start: datetime, days: int) -> dict:
    """The window ``[start, start + days)`` as day columns and one row per lease, its
    bar clipped to the window (a lease ended early ends where it ended)."""
    span = timedelta(days=days).total_seconds()
    rows = []
    for lease in leases:
        end = min(lease.ends_at, lease.ended_at) if lease.ended_at else lease.ends_at
        left = max(0.0, (lease.starts_at - start).total_seconds() / span)
        right = min(1.0, (end - start).total_seconds() / span)
        width = max(0.0, right - left)
        rows.append(Row(lease, end, round(left * 100, 2), round(width * 100, 2)))
    return {
        "days": [start + timedelta(days=n) for n in range(days)],
        "rows": rows,
        "start": start,
        "end": start + timedelta(days=days),
        "day_percent": round(100 / days, 4),
    }


def _midnight(now: datetime) -> datetime:
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def _earliest(error: KumoError) -> dict | None:
    """The earliest period that fits, from a refusal's details (``lease_create``)."""
    starts = error.details.get("earliest_starts_at") or []
    ends = error.details.get("earliest_ends_at") or []
    if not starts or not ends:
        return None
    return {"starts_at": parse_datetime(starts[0]), "ends_at": parse_datetime(ends[0])}


@project_page(write_role=Role.ADMIN)
def leases(request, project):
    """The project's leases and, for its admins, the form to reserve GPUs."""
    models = sorted(guarantees.fleet_gpus(up_only=False))
    form = LeaseForm(request.POST or None, models=models)
    status, earliest = 200, None
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            try:
                lease = services.lease_create(
                    project=project, actor=request.user, **form.cleaned_data
                )
            except KumoError as e:
                status = form_error(form, e)
                if isinstance(e, Conflict):
                    earliest = _earliest(e)
            else:
                start, end = timezone.localtime(lease.starts_at), timezone.localtime(lease.ends_at)
                if lease.hosts is None:
                    text = _(
                        "Lease %(name)s reserved: %(gpus)s %(gpu_model)s GPUs from %(start)s "
                        "to %(end)s %(zone)s."
                    )
                else:
                    text = _(
                        "Lease %(name)s reserved: %(hosts)s whole hosts (%(gpus)s %(gpu_model)s "
                        "GPUs) from %(start)s to %(end)s %(zone)s."
                    )
                messages.success(
                    request,
                    text
                    % {
                        "name": lease.name,
                        "gpus": lease.gpus,
                        "hosts": lease.hosts,
                        "gpu_model": lease.gpu_model,
                        "start": f"{start:%Y-%m-%d %H:%M}",
                        "end": f"{end:%Y-%m-%d %H:%M}",
                        "zone": timezone.get_current_timezone_name(),
                    },
                )
                return redirect("portal:leases", slug=project.slug)
    now = timezone.now()
    shown = (
        Lease.objects.for_project(project)
        .filter(Q(state__in=HOLDING) | Q(ends_at__gte=now - RECENT))
        .select_related("created_by")
        .order_by("starts_at", "pk")
    )
    return page(
        request,
        "portal/leases.html",
        {
            "form": form,
            "earliest": earliest,
            "timeline": timeline(shown, _midnight(now), PROJECT_DAYS),
            "holding": HOLDING,
            "models": models,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def lease_cancel(request, project, pk):
    lease = get_object_or_404(Lease.objects.for_project(project), pk=pk)
    return act(
        request,
        services.lease_cancel,
        done=_("Lease %(name)s cancelled.") % {"name": lease.name},
        back=reverse("portal:leases", kwargs={"slug": project.slug}),
        lease=lease,
        actor=request.user,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def lease_lending(request, project, pk):
    """Lend the lease's idle GPUs to spot VMs (``lend_idle=1``), or keep them idle for its
    VMs (``0``: the spot VMs borrowing them get their eviction notice now)."""
    lease = get_object_or_404(Lease.objects.for_project(project), pk=pk)
    back = reverse("portal:leases", kwargs={"slug": project.slug})
    return _lending(request, lease, lease.name, back)


def _lending(request, lease, name: str, back: str):
    lend = {"1": True, "0": False}.get(request.POST.get("lend_idle", ""))

    def change(lease, lend_idle):  # a bad value is refused, and audited, as ``act`` does
        if lend_idle is None:
            raise InvalidInput.field("lend_idle", "1 (lend) or 0 (keep idle)")
        services.lease_update(lease=lease, lend_idle=lend_idle)

    done = (
        _("Lease %(name)s lends its idle GPUs to spot VMs.")
        if lend
        else _("Lease %(name)s keeps its idle GPUs for its VMs.")
    )
    return act(request, change, done=done % {"name": name}, back=back, lease=lease, lend_idle=lend)


@require_POST
@project_page(write_role=Role.ADMIN)
def lease_change(request, project, pk):
    """Move the lease's end (``ends_at``, the user's time zone), its start before it holds
    GPUs (``starts_at``) or change how many GPUs it holds (``gpus``): later or more is
    admitted again, earlier or fewer gives back."""
    lease = get_object_or_404(Lease.objects.for_project(project), pk=pk)
    back = reverse("portal:leases", kwargs={"slug": project.slug})
    return _change(request, lease, lease.name, back)


def _minute(moment) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M}"


def _said(request, name: str, field):
    """The form's ``name`` as ``field`` reads it: None when empty, False when unreadable."""
    value = request.POST.get(name, "")
    try:
        return field.clean(value) if value else None
    except ValidationError:
        return False


def _change(request, lease, name: str, back: str):
    """The form beside each lease: its start (while it holds no GPUs), its end and its GPUs
    as they are, changed or not. Only what differs from the lease is asked for (a time to
    the minute the field shows)."""
    starts_at = _said(request, "starts_at", forms.DateTimeField())
    ends_at = _said(request, "ends_at", forms.DateTimeField())
    gpus = _said(request, "gpus", forms.IntegerField(min_value=1))
    if starts_at and _minute(starts_at) == _minute(lease.starts_at):
        starts_at = None
    if ends_at and _minute(ends_at) == _minute(lease.ends_at):
        ends_at = None
    if gpus == lease.gpus:
        gpus = None

    def change(lease, starts_at, ends_at, gpus):  # a bad value is refused, and audited
        if starts_at is False:
            raise InvalidInput.field("starts_at", "a date and time, such as 2026-12-01 09:00")
        if ends_at is False:
            raise InvalidInput.field("ends_at", "a date and time, such as 2026-12-01 09:00")
        if gpus is False:
            raise InvalidInput.field("gpus", "a whole number, 1 or more")
        services.lease_update(lease=lease, starts_at=starts_at, ends_at=ends_at, gpus=gpus)

    done = []
    zone = timezone.get_current_timezone_name()
    if starts_at:
        end = _minute(ends_at or lease.ends_at)
        done.append(
            _("Lease %(name)s runs from %(start)s to %(end)s %(zone)s.")
            % {"name": name, "start": _minute(starts_at), "end": end, "zone": zone}
        )
    elif ends_at:
        done.append(
            _("Lease %(name)s ends at %(end)s %(zone)s.")
            % {"name": name, "end": _minute(ends_at), "zone": zone}
        )
    if gpus:
        done.append(_("Lease %(name)s holds %(gpus)s GPUs.") % {"name": name, "gpus": gpus})
    done = " ".join(done) or _("Lease %(name)s is unchanged.") % {"name": name}
    asked = {"starts_at": starts_at, "ends_at": ends_at, "gpus": gpus}
    return act(request, change, done=done, back=back, lease=lease, **asked)


@staff_page
def fleet_leases(request):
    """Every project's leases that hold or will hold GPUs over the next 30 days."""
    now = timezone.now()
    start = _midnight(now)
    end = start + timedelta(days=FLEET_DAYS)
    rows = (
        Lease.objects.filter(state__in=HOLDING, starts_at__lt=end, ends_at__gt=now)
        .select_related("project", "created_by")
        .order_by("starts_at", "pk")
    )
    fleet = sorted(guarantees.fleet_gpus(up_only=False).items())
    return page(
        request,
        "portal/fleet_leases.html",
        {
            "timeline": timeline(rows, start, FLEET_DAYS),
            "fleet": fleet,
            "cancel": True,
            "holding": HOLDING,
        },
    )


@require_POST
@staff_page
def fleet_lease_cancel(request, pk):
    """An operator cancels any project's lease (``compute.services.lease_cancel``, as the
    API's operator endpoint does): one not started is dropped, a started one ends now."""
    lease = get_object_or_404(Lease.objects.select_related("project"), pk=pk)
    return act(
        request,
        services.lease_cancel,
        done=_("Lease %(project)s/%(name)s cancelled.")
        % {"project": lease.project.slug, "name": lease.name},
        back=reverse("portal:fleet-leases"),
        lease=lease,
        actor=request.user,
    )


@require_POST
@staff_page
def fleet_lease_lending(request, pk):
    """An operator changes whether any project's lease lends its idle GPUs (as the API's
    operator endpoint does)."""
    return _lending(request, *_fleet_lease(pk))


@require_POST
@staff_page
def fleet_lease_change(request, pk):
    """An operator moves the end of any project's lease or changes its size (as the API's
    operator endpoint does)."""
    return _change(request, *_fleet_lease(pk))


def _fleet_lease(pk) -> tuple[Lease, str, str]:
    """Any project's lease, its name as the operators see it, and their calendar's URL."""
    lease = get_object_or_404(Lease.objects.select_related("project"), pk=pk)
    return lease, f"{lease.project.slug}/{lease.name}", reverse("portal:fleet-leases")
