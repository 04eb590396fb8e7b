"""Billing: the month's spend and forecast with spend by day, invoices (CSV download, the
same bytes as the API's), budgets (admins), the prepaid points balance and its ledger, all
through ``tenants.billing``."""

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from controlplane.portal import charts, reports
from controlplane.portal.access import project_page
from controlplane.portal.forms import BudgetForm
from controlplane.portal.views.common import act, page, submit
from controlplane.portal.views.projects import month_spend
from tenants import billing as services
from tenants.choices import Role
from tenants.models import Budget, Invoice, PointsEntry

POINTS_ENTRIES = 50


@project_page(write_role=Role.ADMIN)
def billing(request, project):
    """Spend and forecast this month, spend by day, invoices, and budgets (admins add)."""
    form = BudgetForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.budget_create(project=project, **v))
        if ok:
            messages.success(
                request, _("Budget %(name)s created.") % {"name": form.cleaned_data["name"]}
            )
            return redirect("portal:billing", slug=project.slug)
    now = timezone.now()
    spend = month_spend(project, now)
    chart = None
    if spend is not None:
        chart = charts.bars(
            [(f"{d:%d}", v) for d, v in reports.spend_by_day(project, now)],
            unit=spend["currency"],
            title=_("Spend per day this month"),
        )
    return page(
        request,
        "portal/billing.html",
        {
            "spend": spend,
            "chart": chart,
            "invoices": Invoice.objects.for_project(project).order_by("-period_start"),
            "budgets": Budget.objects.for_project(project).order_by("name"),
            "points_balance": services.points_balance(project),
            "points_entries": PointsEntry.objects.for_project(project)
            .select_related("invoice", "created_by")
            .order_by("-id")[:POINTS_ENTRIES],
            "form": form,
        },
        project=project,
        status=status,
    )


@project_page()
def invoice_csv(request, project, pk):
    """The invoice as CSV, derived from its canonical JSON (``tenants.billing.invoice_csv``)."""
    invoice = get_object_or_404(Invoice.objects.for_project(project), pk=pk)
    response = HttpResponse(
        services.invoice_csv(invoice.document).encode(), content_type="text/csv; charset=utf-8"
    )
    name = f"kumo-invoice-{project.slug}-{invoice.period_start:%Y-%m}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-SHA256"] = invoice.content_hash
    return response


@project_page()
def invoice_json(request, project, pk):
    """The invoice's canonical, signed JSON document, byte for byte what the API serves
    (its SHA-256 in ``X-Content-SHA256``)."""
    invoice = get_object_or_404(Invoice.objects.for_project(project), pk=pk)
    response = HttpResponse(invoice.document.encode(), content_type="application/json")
    name = f"kumo-invoice-{project.slug}-{invoice.period_start:%Y-%m}.json"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-SHA256"] = invoice.content_hash
    return response


@project_page()
def invoice_verify(request, project, pk):
    """Recompute the invoice from the usage and rate cards in the database now
    (``tenants.billing.invoice_verify``, as the API's ``verify``) and say whether its bytes
    are the same, on the billing page."""
    invoice = get_object_or_404(Invoice.objects.for_project(project), pk=pk)
    answer = services.invoice_verify(invoice)
    period = f"{invoice.period_start:%Y-%m}"
    if answer["identical"]:
        messages.success(
            request,
            _("Invoice %(period)s verified: recomputed, identical (%(hash)s).")
            % {"period": period, "hash": answer["stored_hash"]},
        )
    else:
        messages.error(
            request,
            _("Invoice %(period)s differs when recomputed: stored %(stored)s, recomputed %(new)s.")
            % {
                "period": period,
                "stored": answer["stored_hash"],
                "new": answer["recomputed_hash"],
            },
        )
    return redirect("portal:billing", slug=project.slug)


@project_page(write_role=Role.ADMIN)
def budget_edit(request, project, pk):
    """Change a budget's name, amount, thresholds or policy (admins), through
    ``tenants.billing.budget_update``: what the API's budget PATCH does."""
    budget = get_object_or_404(Budget.objects.for_project(project), pk=pk)
    initial = {
        "name": budget.name,
        "amount": budget.amount,
        "thresholds": ", ".join(str(t) for t in budget.thresholds),
        "policy": budget.policy,
    }
    form = BudgetForm(request.POST or None, initial=initial)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.budget_update(budget=budget, **v))
        if ok:
            messages.success(
                request, _("Budget %(name)s changed.") % {"name": form.cleaned_data["name"]}
            )
            return redirect("portal:billing", slug=project.slug)
    return page(
        request,
        "portal/budget_edit.html",
        {"budget": budget, "form": form},
        project=project,
        status=status,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def budget_delete(request, project, pk):
    budget = get_object_or_404(Budget.objects.for_project(project), pk=pk)
    return act(
        request,
        services.budget_delete,
        done=_("Budget %(name)s deleted.") % {"name": budget.name},
        back=reverse("portal:billing", kwargs={"slug": project.slug}),
        budget=budget,
    )
