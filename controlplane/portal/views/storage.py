"""Storage: the project's volumes and buckets, written through ``storage.services``."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from controlplane.portal.access import project_page
from controlplane.portal.forms import BucketForm, VolumeForm
from controlplane.portal.views.common import act, page, submit
from storage import services
from storage.models import Bucket, Volume


@project_page()
def storage(request, project):
    which = request.POST.get("form")
    volume_form = VolumeForm(request.POST if which == "volume" else None)
    bucket_form = BucketForm(request.POST if which == "bucket" else None)
    status = 200
    if request.method == "POST":
        if which == "bucket":
            ok, status = submit(bucket_form, lambda v: services.bucket_create(project=project, **v))
        else:
            ok, status = submit(volume_form, lambda v: services.volume_create(project=project, **v))
        if ok:
            messages.success(request, f"{which.capitalize()} created.")
            return redirect("portal:storage", slug=project.slug)
    return page(
        request,
        "portal/storage.html",
        {
            "volumes": Volume.objects.for_project(project).select_related("vm").order_by("name"),
            "buckets": Bucket.objects.for_project(project).order_by("name"),
            "volume_form": volume_form,
            "bucket_form": bucket_form,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page()
def volume_delete(request, project, pk):
    volume = get_object_or_404(Volume.objects.for_project(project), pk=pk)
    return act(
        request,
        services.volume_delete,
        done=f"Volume {volume.name} deleted.",
        back=reverse("portal:storage", kwargs={"slug": project.slug}),
        volume=volume,
    )


@require_POST
@project_page()
def bucket_delete(request, project, pk):
    bucket = get_object_or_404(Bucket.objects.for_project(project), pk=pk)
    return act(
        request,
        services.bucket_delete,
        done=f"Bucket {bucket.name} deleted.",
        back=reverse("portal:storage", kwargs={"slug": project.slug}),
        bucket=bucket,
    )
