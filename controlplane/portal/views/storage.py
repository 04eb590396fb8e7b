"""Storage: the project's volumes (create, attach to a VM, detach, extend, delete), its
shares (make one on a tier the site serves, extend, delete) and how to mount them, its
buckets and their S3 endpoint, and its S3 access keys (a project admin's to make and
revoke; the secret is shown once), written through ``storage.services``."""

from django.conf import settings
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from compute.choices import VmState
from compute.models import VirtualMachine
from controlplane.portal.access import project_page
from controlplane.portal.forms import (
    AccessKeyForm,
    BucketForm,
    BucketQuotaForm,
    ShareExtendForm,
    ShareForm,
    VolumeAttachForm,
    VolumeExtendForm,
    VolumeForm,
)
from controlplane.portal.views.common import act, page, submit
from storage import services
from storage.models import AccessKey, Bucket, Share, Volume
from storage.selectors import mount_command
from tenants.choices import Role


def _render(request, project, *, status=200, **context):
    """The storage page; ``context`` replaces its forms (bound, with errors) or adds the
    secret of a key just made, or the form of a volume action that failed (``problem``)."""
    shares = list(Share.objects.for_project(project).order_by("name"))
    for share in shares:
        share.mount_command = mount_command(share)
    context = {
        "volumes": Volume.objects.for_project(project).select_related("vm").order_by("name"),
        "vms": VirtualMachine.objects.for_project(project)
        .exclude(state=VmState.DELETED)
        .order_by("name"),
        "shares": shares,
        "buckets": Bucket.objects.for_project(project).order_by("name"),
        "endpoint": settings.OBJECT_STORE["endpoint"],
        "access_keys": AccessKey.objects.for_project(project)
        .select_related("created_by")
        .order_by("-created_at"),
        "volume_form": VolumeForm(),
        "bucket_form": BucketForm(),
        "share_form": ShareForm(),
        "share_tiers": bool(settings.SHARE_TIERS),
        "access_key_form": AccessKeyForm(),
        "may_manage_keys": Role.at_least(request.membership.role, Role.ADMIN),
        **context,
    }
    return page(request, "portal/storage.html", context, project=project, status=status)


@project_page()
def storage(request, project):
    # The form posted (a post naming none is the volume's); on a GET every form is unbound.
    which = None
    if request.method == "POST":
        which = request.POST.get("form")
        which = which if which in ("bucket", "share") else "volume"
    kinds = {"volume": VolumeForm, "bucket": BucketForm, "share": ShareForm}
    forms = {name: kind(request.POST if name == which else None) for name, kind in kinds.items()}
    status = 200
    if which is not None:
        create = {
            "volume": services.volume_create,
            "bucket": services.bucket_create,
            "share": services.share_create,
        }[which]
        ok, status = submit(forms[which], lambda v: create(project=project, **v))
        if ok:
            done = {
                "volume": _("Volume created."),
                "bucket": _("Bucket created."),
                "share": _("Share created: it can be mounted once its host has made it."),
            }
            messages.success(request, done[which])
            return redirect("portal:storage", slug=project.slug)
    return _render(
        request,
        project,
        status=status,
        **{f"{name}_form": form for name, form in forms.items()},
    )


def _volume(project, pk) -> Volume:
    return get_object_or_404(Volume.objects.for_project(project), pk=pk)


def _volume_form(request, project, form, call, *, title: str, done):
    """Run a volume action's form: its success is a message on the storage page; bad
    input (400) or the service's refusal is the form, with the error under its field,
    on the storage page."""
    ok, status = submit(form, call)
    if ok:
        messages.success(request, done(form.cleaned_data))
        return redirect("portal:storage", slug=project.slug)
    problem = {"title": title, "form": form, "action": request.path}
    return _render(request, project, status=status, problem=problem)


@require_POST
@project_page()
def volume_attach(request, project, pk):
    volume = _volume(project, pk)
    form = VolumeAttachForm(request.POST, project=project)
    return _volume_form(
        request,
        project,
        form,
        lambda v: services.volume_attach(volume=volume, vm=v["vm"]),
        title=_("Attach volume %(name)s") % {"name": volume.name},
        done=lambda v: (
            _("Volume %(name)s attached to VM %(vm)s.") % {"name": volume.name, "vm": v["vm"].name}
        ),
    )


@require_POST
@project_page()
def volume_extend(request, project, pk):
    volume = _volume(project, pk)
    form = VolumeExtendForm(request.POST)
    return _volume_form(
        request,
        project,
        form,
        lambda v: services.volume_extend(volume=volume, size_gib=v["size_gib"]),
        title=_("Extend volume %(name)s") % {"name": volume.name},
        done=lambda v: (
            _("Volume %(name)s extended to %(size)s GiB.")
            % {"name": volume.name, "size": v["size_gib"]}
        ),
    )


@require_POST
@project_page()
def volume_detach(request, project, pk):
    volume = _volume(project, pk)
    return act(
        request,
        services.volume_detach,
        done=_("Volume %(name)s detached.") % {"name": volume.name},
        back=reverse("portal:storage", kwargs={"slug": project.slug}),
        volume=volume,
    )


@require_POST
@project_page()
def volume_delete(request, project, pk):
    volume = _volume(project, pk)
    return act(
        request,
        services.volume_delete,
        done=_("Volume %(name)s deleted.") % {"name": volume.name},
        back=reverse("portal:storage", kwargs={"slug": project.slug}),
        volume=volume,
    )


@require_POST
@project_page()
def share_extend(request, project, pk):
    share = get_object_or_404(Share.objects.for_project(project), pk=pk)
    form = ShareExtendForm(request.POST)
    return _volume_form(
        request,
        project,
        form,
        lambda v: services.share_extend(share=share, quota_gib=v["quota_gib"]),
        title=_("Extend share %(name)s") % {"name": share.name},
        done=lambda v: (
            _("Share %(name)s extended to %(size)s GiB.")
            % {"name": share.name, "size": v["quota_gib"]}
        ),
    )


@require_POST
@project_page()
def share_delete(request, project, pk):
    share = get_object_or_404(Share.objects.for_project(project), pk=pk)
    return act(
        request,
        services.share_delete,
        done=_("Share %(name)s deleted.") % {"name": share.name},
        back=reverse("portal:storage", kwargs={"slug": project.slug}),
        share=share,
    )


@require_POST
@project_page()
def bucket_quota(request, project, pk):
    bucket = get_object_or_404(Bucket.objects.for_project(project), pk=pk)
    form = BucketQuotaForm(request.POST)
    return _volume_form(
        request,
        project,
        form,
        lambda v: services.bucket_update(bucket=bucket, quota_gib=v["quota_gib"]),
        title=_("Quota of bucket %(name)s") % {"name": bucket.name},
        done=lambda v: (
            _("Bucket %(name)s's quota is %(size)s GiB.")
            % {"name": bucket.name, "size": v["quota_gib"]}
        ),
    )


@require_POST
@project_page()
def bucket_delete(request, project, pk):
    bucket = get_object_or_404(Bucket.objects.for_project(project), pk=pk)
    return act(
        request,
        services.bucket_delete,
        done=_("Bucket %(name)s deleted.") % {"name": bucket.name},
        back=reverse("portal:storage", kwargs={"slug": project.slug}),
        bucket=bucket,
    )


@project_page(write_role=Role.ADMIN)
def access_key_create(request, project):
    """A new S3 access key (admins: a key reaches every bucket of the project); its secret
    is in this one answer only, as an API token's is."""
    if request.method != "POST":
        return redirect("portal:storage", slug=project.slug)
    form = AccessKeyForm(request.POST)
    made = []
    ok, status = submit(
        form,
        lambda v: made.append(
            services.access_key_create(
                project=project, description=v["description"], actor=request.user
            )
        ),
    )
    if not ok:
        return _render(request, project, status=status, access_key_form=form)
    key, secret = made[0]
    return _render(request, project, new_key=key, secret=secret)


@require_POST
@project_page(write_role=Role.ADMIN)
def access_key_delete(request, project, pk):
    key = get_object_or_404(AccessKey.objects.for_project(project), pk=pk)
    return act(
        request,
        services.access_key_delete,
        done=_("Access key %(access_key_id)s deleted.") % {"access_key_id": key.access_key_id},
        back=reverse("portal:storage", kwargs={"slug": project.slug}),
        key=key,
    )
