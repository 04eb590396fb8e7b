"""Project applications in the portal: apply for a new project, or for a renewal or more
quota of a project you administer; see your applications and the reviewers' comments;
amend a returned one. Reviewers (operators, and institutional reviewers for their
institutions' applicants) see the applications they may decide on, with Approve / Return /
Reject. Which applications a user sees and may review is ``tenants.selectors``' rule, the
same as the API's; any other answers 404."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from controlplane.errors import KumoError
from controlplane.portal.views.common import page, submit
from tenants import applications, selectors
from tenants.choices import Role
from tenants.models import InstitutionReviewer, Project, ProjectApplication

Kind = ProjectApplication.Kind
#: the largest number a resource field holds (a PostgreSQL integer)
MAX_ASK = 2**31 - 1
RESOURCE_LABELS = {
    "vcpus": gettext_lazy("vCPUs"),
    "memory_gib": gettext_lazy("Memory (GiB)"),
    "gpus": gettext_lazy("GPUs"),
    "storage_gib": gettext_lazy("Storage (GiB)"),
    "global_ips": gettext_lazy("Global IPs"),
}


def resource_field(**kwargs) -> forms.IntegerField:
    return forms.IntegerField(min_value=0, max_value=MAX_ASK, **kwargs)


def date_field(**kwargs) -> forms.DateField:
    return forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), **kwargs)


class ApplicationForm(forms.Form):
    """A new project."""

    slug = forms.SlugField(
        max_length=40,
        label=gettext_lazy("Slug"),
        help_text=gettext_lazy("the project's short name"),
    )
    title = forms.CharField(max_length=200, label=gettext_lazy("Title"))
    purpose = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), label=gettext_lazy("Purpose")
    )
    field = forms.CharField(max_length=200, required=False, label=gettext_lazy("Field"))
    vcpus = resource_field(initial=0, label=RESOURCE_LABELS["vcpus"])
    memory_gib = resource_field(initial=0, label=RESOURCE_LABELS["memory_gib"])
    gpus = resource_field(initial=0, label=RESOURCE_LABELS["gpus"])
    storage_gib = resource_field(initial=0, label=RESOURCE_LABELS["storage_gib"])
    global_ips = resource_field(initial=0, label=RESOURCE_LABELS["global_ips"])
    valid_from = date_field(required=False, label=gettext_lazy("Valid from"))
    valid_until = date_field(required=False, label=gettext_lazy("Valid until"))


class ProjectApplicationForm(forms.Form):
    """A renewal or a quota increase of a project the user owns or administers (the only
    projects offered; the service checks the role again)."""

    kind = forms.ChoiceField(
        label=gettext_lazy("Kind"),
        choices=[
            (Kind.RENEWAL, gettext_lazy("Renewal (a later end date)")),
            (Kind.QUOTA, gettext_lazy("Quota increase")),
        ],
    )
    project = forms.ModelChoiceField(
        queryset=Project.objects.none(), to_field_name="slug", label=gettext_lazy("Project")
    )
    purpose = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        label=gettext_lazy("Purpose"),
        help_text=gettext_lazy("why the project needs it"),
    )
    title = forms.CharField(
        max_length=200,
        required=False,
        label=gettext_lazy("Title"),
        help_text=gettext_lazy("optional"),
    )
    valid_until = date_field(
        required=False,
        label=gettext_lazy("New end date"),
        help_text=gettext_lazy("renewal"),
    )
    vcpus = resource_field(required=False, help_text=gettext_lazy("quota increase: the new limits"))
    memory_gib = resource_field(required=False)
    gpus = resource_field(required=False)
    storage_gib = resource_field(required=False)
    global_ips = resource_field(required=False)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = administered_by(user)
        for name, label in RESOURCE_LABELS.items():
            self.fields[name].label = label

    def service_fields(self) -> dict:
        """What ``application_submit`` takes for the chosen kind: a renewal its end date, a
        quota increase the limits asked (blank ones as 0: unchanged)."""
        v = self.cleaned_data
        kind, project = v["kind"], v["project"]
        default_title = {Kind.RENEWAL: "Renewal of", Kind.QUOTA: "More quota for"}[kind]
        fields = {
            "kind": kind,
            "project": project,
            "purpose": v["purpose"],
            "title": v["title"] or f"{default_title} {project.slug}",
        }
        if kind == Kind.RENEWAL:
            fields["valid_until"] = v["valid_until"]
        else:
            fields.update({r: v[r] or 0 for r in ProjectApplication.RESOURCES})
        return fields


class AmendForm(forms.Form):
    """The changes to a returned application: blank fields stay as they were."""

    purpose = forms.CharField(required=False)
    vcpus = resource_field(required=False)
    memory_gib = resource_field(required=False)
    gpus = resource_field(required=False)
    storage_gib = resource_field(required=False)
    global_ips = resource_field(required=False)
    valid_until = date_field(required=False)

    def changes(self) -> dict:
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}


def administered_by(user):
    """The projects where ``user`` is an owner or an admin."""
    return Project.objects.filter(
        memberships__user=user, memberships__role__in=[Role.OWNER, Role.ADMIN]
    ).order_by("slug")


def _first_error(form) -> str:
    name, errors = next(iter(form.errors.items()))
    return errors[0] if name not in form.fields else f"{name}: {errors[0]}"


@login_required
def application_list(request):
    user = request.user
    posted = request.POST if request.method == "POST" else None
    which = (posted or {}).get("apply", "new")
    form = ApplicationForm(posted if which == "new" else None)
    initial = {k: request.GET[k] for k in ("kind", "project") if k in request.GET}
    change = ProjectApplicationForm(
        posted if which == "project" else None,
        user=user,
        initial=initial,
        auto_id="id_project_%s",  # the page holds both forms: no two inputs share an id
    )
    status = 200
    if posted is not None:
        if which == "project":
            ok, status = submit(
                change,
                lambda v: applications.application_submit(
                    applicant=user, **change.service_fields()
                ),
            )
        else:
            ok, status = submit(
                form, lambda v: applications.application_submit(applicant=user, **v)
            )
        if ok:
            messages.success(request, _("Application submitted."))
            return redirect("portal:applications")
    rows = (
        selectors.applications_visible_to(user)
        .select_related("applicant", "project")
        .order_by("-id")
    )
    reviewer = user.is_staff or InstitutionReviewer.objects.filter(user=user).exists()
    return page(
        request,
        "portal/applications.html",
        {
            "applications": rows[:200],
            "form": form,
            "change_form": change,
            # the form shows where there is a project to choose, or an answer to show
            "administers": change.is_bound or change.fields["project"].queryset.exists(),
            "reviewer": reviewer,
        },
        status=status,
    )


@require_POST
@login_required
def application_review(request, pk):
    """Decide on an application you may see; the service says why a decision is refused
    (your own; not of your institutions)."""
    application = get_object_or_404(selectors.applications_visible_to(request.user), pk=pk)
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
        messages.success(
            request,
            _("Application %(pk)s: %(decision)s.")
            % {"pk": pk, "decision": request.POST.get("decision")},
        )
    return redirect("portal:applications")


@require_POST
@login_required
def application_amend(request, pk):
    application = get_object_or_404(ProjectApplication, pk=pk, applicant=request.user)
    form = AmendForm(request.POST)
    if not form.is_valid():
        messages.error(
            request,
            _("Application %(pk)s not amended: %(form)s") % {"pk": pk, "form": _first_error(form)},
        )
        return redirect("portal:applications")
    try:
        applications.application_amend(
            application=application, actor=request.user, **form.changes()
        )
    except KumoError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, _("Application amended and submitted again."))
    return redirect("portal:applications")


@require_POST
@login_required
def application_withdraw(request, pk):
    """The applicant takes back a submitted or returned application
    (``tenants.applications.application_withdraw``, which says why it refuses)."""
    application = get_object_or_404(ProjectApplication, pk=pk, applicant=request.user)
    try:
        applications.application_withdraw(application=application, actor=request.user)
    except KumoError as e:
        messages.error(request, e.message)
    else:
        messages.success(request, _("Application %(pk)s withdrawn.") % {"pk": pk})
    return redirect("portal:applications")
