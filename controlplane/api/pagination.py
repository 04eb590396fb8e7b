from django.core.exceptions import EmptyResultSet
from django.core.paginator import EmptyPage, Page, PageNotAnInteger
from django.core.paginator import Paginator as DjangoPaginator
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.query import ModelIterable, ValuesIterable
from rest_framework.pagination import PageNumberPagination

from controlplane.errors import InvalidInput

#: the page's rows carry the list's size under this name, for one row (then removed)
TOTAL = "_kumo_page_total"
#: the largest OFFSET and LIMIT the database takes (a signed 64-bit integer)
_MAX_OFFSET = 2**63 - 1


def counted_queryset(queryset: QuerySet) -> QuerySet | None:
    """``queryset`` with the count of all its rows on each row (as ``TOTAL``), counted as
    Django counts: the rows of the query without its ordering (a grouped query, with its own
    select; any other, its keys alone). None when the queryset can match nothing."""
    inner = queryset.order_by()
    if inner.query.group_by is None:
        inner = inner.values("pk")
    try:
        sql, params = inner.query.get_compiler(using=queryset.db).as_sql()
    except EmptyResultSet:
        return None
    return queryset.annotate(**{TOTAL: RawSQL(f"SELECT COUNT(*) FROM ({sql}) AS counted", params)})


class ListPage(Page):
    """Django's page, iterated as the list of its rows it holds (DRF lists a page): not one
    ``__getitem__`` call, with its checks, per row."""

    def __iter__(self):
        if not isinstance(self.object_list, list):
            self.object_list = list(self.object_list)
        return iter(self.object_list)


class CountingPaginator(DjangoPaginator):
    """Django's paginator, except that a page of a plain queryset is read with the count of
    the whole list in the same query (a scalar subquery the database runs once): one round trip
    per page, not two. The answer is the same as Django's: the same rows, the same count, the
    same errors for a page out of range (a page past the end has no rows, whatever the count;
    an empty first page means an empty list).

    A queryset the subquery could count differently (distinct, combined or sliced) and
    anything that is not a queryset take Django's own path.
    """

    def page(self, number):
        precompiled = getattr(self.object_list, "read_page", None)
        if precompiled is not None and (self.orphans or not self.allow_empty_first_page):
            self.object_list, precompiled = self.object_list.queryset(), None
        if precompiled is None and not self._countable():
            return super().page(number)
        number = self._validate_number(number)
        bottom = (number - 1) * self.per_page
        if bottom + self.per_page > _MAX_OFFSET:  # past any list, and past the SQL's integers
            return self._djangos_page(number)
        if precompiled is not None:
            # A page whose SQL, count included, was compiled once (``fastread.CompiledList``):
            # its rows come already answered, and the count beside them.
            rows, total = precompiled(bottom, self.per_page)
            if not rows and number > 1:
                raise EmptyPage(self.error_messages["no_results"])
            self.__dict__["count"] = total  # Paginator.count is a cached_property
            return self._get_page(rows, number, self)
        counted = counted_queryset(self.object_list)
        if counted is None:  # a condition nothing can match (``pk__in=[]``, ``none()``)
            return super().page(number)
        rows = list(counted[bottom : bottom + self.per_page])
        if not rows and number > 1:
            raise EmptyPage(self.error_messages["no_results"])
        if rows and isinstance(rows[0], dict):
            total = rows[0][TOTAL]
            for row in rows:
                del row[TOTAL]
        elif rows:
            total = getattr(rows[0], TOTAL)
            for row in rows:
                delattr(row, TOTAL)
        else:
            total = 0
        self.__dict__["count"] = total  # Paginator.count is a cached_property
        return self._get_page(rows, number, self)

    def _get_page(self, *args, **kwargs):
        return ListPage(*args, **kwargs)

    def _djangos_page(self, number):
        queryset = getattr(self.object_list, "queryset", None)
        if queryset is not None:  # compiled SQL stands for this queryset: Django reads that
            self.object_list = queryset()
        return super().page(number)

    def _countable(self) -> bool:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet) or self.orphans or not self.allow_empty_first_page:
            return False
        query = queryset.query
        return (
            queryset._iterable_class in (ModelIterable, ValuesIterable)
            and not query.distinct
            and not query.combinator
            and not query.is_sliced
            and not query.extra
            and TOTAL not in query.annotations
        )

    def _validate_number(self, number) -> int:
        """Django's checks of a page number that need no count."""
        try:
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            number = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger(self.error_messages["invalid_page"]) from None
        if number < 1:
            raise EmptyPage(self.error_messages["min_page"])
        return number


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M``; ``page_size`` is capped so no request can ask for everything."""

    django_paginator_class = CountingPaginator
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
