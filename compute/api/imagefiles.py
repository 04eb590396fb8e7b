"""``GET /api/v1/image-files/<token>``: an image's bytes for a host's agent, when the image
store is a directory hosts cannot read themselves (``KUMO_IMAGE_FETCH_BASE_URL``).

The token is the whole credential: signed by the controller for one image, valid for
``KUMO_IMAGE_URL_TTL_S`` (``compute.services.images.file_token``). The body streams from
the store, one chunk at a time.
"""

from django.http import Http404, StreamingHttpResponse
from django.views.decorators.http import require_GET

from compute.models import Image
from compute.services.images import image_file_for_token, image_store


@require_GET
def image_file(request, token: str):
    key = image_file_for_token(token)
    if key is None:
        raise Http404("no such image file, or its URL expired")
    size = Image.objects.filter(location=key).values_list("size_bytes", flat=True).first()
    response = StreamingHttpResponse(
        image_store().open(key), content_type="application/octet-stream"
    )
    response["Content-Length"] = str(size)
    return response
