"""Images: the ones the project may boot, its own uploads (streamed by the browser straight
to the API, ``PUT …/images/{id}/file/``, never through a form), and deleting its own,
written through ``compute.services``."""

from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST

from compute import services
from compute.choices import ImageFormat
from compute.models import Image
from controlplane.portal.access import project_page
from controlplane.portal.views.common import act, page


@project_page()
def images(request, project):
    return page(
        request,
        "portal/images.html",
        {
            "images": Image.objects.visible_to(project).select_related("project"),
            "formats": ImageFormat.values,
            "api_images": f"/api/v1/projects/{project.slug}/images/",
        },
        project=project,
    )


@require_POST
@project_page()
def image_delete(request, project, pk):
    image = get_object_or_404(Image.objects.visible_to(project).filter(project=project), pk=pk)
    return act(
        request,
        services.image_delete,
        done=f"Image {image.name} deleted.",
        back=reverse("portal:images", kwargs={"slug": project.slug}),
        image=image,
    )
