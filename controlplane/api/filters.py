from functools import cache

from django import forms
from django_filters import CharFilter, FilterSet, TypedChoiceFilter
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework.settings import api_settings

from controlplane.errors import InvalidInput


class FilterBackend(DjangoFilterBackend):
    """django-filter, except that a typed filter (a choice, a date) given with no value is a 400
    instead of being ignored: ``?since=`` is a client's mistake, not "since forever".

    A request that gives no filter a value (no parameter but the page, the page size, the
    ordering) keeps its queryset as it is, without building a FilterSet: its form and the
    deep copy of its fields cost a list request more than its page's query, to filter
    nothing. That holds only for filtersets whose filters do nothing without a value
    (``_inert_without_values``); any other keeps django-filter's path.
    """

    def filter_queryset(self, request, queryset, view):
        if self._filters_nothing(request, view):
            return queryset
        return super().filter_queryset(request, queryset, view)

    def _filters_nothing(self, request, view) -> bool:
        paginator = getattr(view, "paginator", None)
        others = {
            getattr(paginator, "page_query_param", None),
            getattr(paginator, "page_size_query_param", None),
            api_settings.ORDERING_PARAM,
            api_settings.URL_FORMAT_OVERRIDE,
        }
        given = set(request.query_params)
        if not given <= others:
            return False
        filterset_class = getattr(view, "filterset_class", None)
        if filterset_class is not None:
            names = set(filterset_class.base_filters)
            return _inert_without_values(filterset_class) and not names & given
        # An AutoFilterSet (``filterset_fields``): one plain filter per field, named by it.
        return not set(getattr(view, "filterset_fields", None) or ()) & given

    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is not None:
            blank = {
                name: ["no value given"]
                for name, field in filterset.filters.items()
                if request.query_params.get(name) == "" and not isinstance(field, CharFilter)
            }
            if blank:
                raise InvalidInput(f"{next(iter(blank))}: no value given", details=blank)
        return filterset


@cache
def _inert_without_values(filterset_class) -> bool:
    """True when ``filterset_class``, given no value for any filter, answers its queryset as
    it is: FilterSet's own form, queryset and filtering, no required filter, and every filter
    django-filter's own (which skip an empty value, as do ``method`` filters)."""
    return (
        filterset_class.filter_queryset is FilterSet.filter_queryset
        and filterset_class.qs is FilterSet.qs
        and filterset_class.__init__ is FilterSet.__init__
        and filterset_class._meta.form is forms.Form
        and all(
            not f.extra.get("required") and type(f).filter.__module__.startswith("django_filters.")
            for f in filterset_class.base_filters.values()
        )
    )


@extend_schema_field(OpenApiTypes.BOOL)
class StrictBooleanFilter(TypedChoiceFilter):
    """``true`` or ``false`` and nothing else (400): django-filter's BooleanFilter quietly
    ignores a value it cannot read, which turns a typo into "no filter"."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("choices", [("true", "true"), ("false", "false")])
        kwargs.setdefault("coerce", lambda value: value == "true")
        super().__init__(*args, **kwargs)
