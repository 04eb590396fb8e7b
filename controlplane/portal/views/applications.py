"""Project applications in the portal: apply, see your applications and the reviewers'
comments, amend a returned one; operators review (approve, return with a comment, reject)."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from controlplane.errors import KumoError
from controlplane.portal.views.common import page, submit
from tenants import applications
from tenants.models import ProjectApplication


class ApplicationForm(forms.Form):
    slug = forms.SlugField(max_length=40, help_text="the project's short name")
    title = forms.CharField(max_length=200)
    purpose = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    field = forms.CharField(max_length=200, required=False)
    vcpus = forms.IntegerField(min_value=0, initial=0)
    memory_gib = forms.IntegerField(min_value=0, initial=0)
    gpus = forms.IntegerField(min_value=0, initial=0)
    storage_gib = forms.IntegerField(min_value=0, initial=0)
    global_ips = forms.IntegerField(min_value=0, initial=0)
    valid_from = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    valid_until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))


@login_required
def application_list(request):
    form = ApplicationForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(
            form, lambda v: applications.application_submit(applicant=request.user, **v)
        )
        if ok:
            messages.success(request, "Application submitted.")
            return redirect("portal:applications")
    qs = ProjectApplication.objects.select_related("applicant", "project").order_by("-id")
    if not request.user.is_staff:
        qs = qs.filter(applicant=request.user)
    return page(
        request,
        "portal/applications.html",
        {"applications": qs[:200], "form": form, "reviewer": request.user.is_staff},
        status=status,
    )


@require_POST
@login_required
def application_review(request, pk):
    application = get_object_or_404(ProjectApplication, pk=pk)
    try:
        applications.application_review(
            application=application,
            reviewer=request.user,
            decision=request.POST.get("decision", ""),
            comment=request.POST.get("comment", ""),
        )
    except KumoError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, f"Application {pk}: {request.POST.get('decision')}.")
    return redirect("portal:applications")


@require_POST
@login_required
def application_amend(request, pk):
    application = get_object_or_404(ProjectApplication, pk=pk, applicant=request.user)
    changes = {}
    for name in ("purpose", *ProjectApplication.RESOURCES):
        value = request.POST.get(name, "").strip()
        if value:
            changes[name] = int(value) if name != "purpose" and value.isdigit() else value
    try:
        applications.application_amend(application=application, actor=request.user, **changes)
    except KumoError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, "Application amended and submitted again.")
    return redirect("portal:applications")
