"""Images: the ones the project may boot, uploading its own (a multipart form: the record
is registered, then the file is streamed into the image store by
``compute.services.image_upload``, the service behind the API's ``PUT …/images/{id}/file/``),
and deleting its own, written through ``compute.services``."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from compute import services
from compute.models import Image
from controlplane.errors import KumoError
from controlplane.portal.access import form_error, project_page
from controlplane.portal.forms import ImageUploadForm
from controlplane.portal.views.common import act, page


def _upload(project, v) -> Image:
    """Register the image, then stream its file (read in bounded chunks from Django's
    upload, spooled to a temporary file past a few MiB) into the store. A failed upload
    leaves the image ``failed`` with the reason, as through the API."""
    image = services.image_register(
        project=project,
        name=v["name"],
        os_distro=v["os_distro"],
        os_version=v["os_version"],
        format=v["format"],
        login_user=v["login_user"],
    )
    upload = v["file"]
    return services.image_upload(image=image, stream=upload, length=upload.size)


@project_page()
def images(request, project):
    form = ImageUploadForm(request.POST or None, request.FILES or None)
    status = 200
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            try:
                image = _upload(project, form.cleaned_data)
            except KumoError as e:
                status = form_error(form, e)
            else:
                messages.success(
                    request,
                    _("Image %(name)s uploaded (%(size_bytes)s bytes, %(checksum)s).")
                    % {
                        "name": image.name,
                        "size_bytes": image.size_bytes,
                        "checksum": image.checksum,
                    },
                )
                return redirect("portal:images", slug=project.slug)
    return page(
        request,
        "portal/images.html",
        {
            "images": Image.objects.visible_to(project).select_related("project"),
            "form": form,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page()
def image_delete(request, project, pk):
    image = get_object_or_404(Image.objects.visible_to(project).filter(project=project), pk=pk)
    return act(
        request,
        services.image_delete,
        done=_("Image %(name)s deleted.") % {"name": image.name},
        back=reverse("portal:images", kwargs={"slug": project.slug}),
        image=image,
    )
