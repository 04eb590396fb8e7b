from rest_framework.pagination import PageNumberPagination

from controlplane.errors import InvalidInput


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M``; ``page_size`` is capped so no request can ask for everything."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        # DRF quietly ignores a page_size that is not a number; say so instead.
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None:
            try:
                int(raw)
            except ValueError:
                raise InvalidInput.field(self.page_size_query_param, "not an integer") from None
        return super().get_page_size(request)
