from rest_framework.pagination import PageNumberPagination

from controlplane.errors import InvalidInput


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M``; ``page_size`` is capped so no request can ask for everything."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    last_page_strings = ()  # DRF's ?page=last: not in the schema, which says a number

    def paginate_queryset(self, queryset, request, view=None):
        # DRF quietly ignores a page or page_size that is not a number; say so instead.
        for param in (self.page_query_param, self.page_size_query_param):
            raw = request.query_params.get(param)
            if raw is not None:
                try:
                    int(raw)
                except ValueError:
                    raise InvalidInput.field(param, "not an integer") from None
        return super().paginate_queryset(queryset, request, view)
