from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M``; ``page_size`` is capped so no request can ask for everything."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
