from django_filters import CharFilter, TypedChoiceFilter
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from controlplane.errors import InvalidInput


class FilterBackend(DjangoFilterBackend):
    """django-filter, except that a typed filter (a choice, a date) given with no value is a 400
    instead of being ignored: ``?since=`` is a client's mistake, not "since forever"."""

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


@extend_schema_field(OpenApiTypes.BOOL)
class StrictBooleanFilter(TypedChoiceFilter):
    """``true`` or ``false`` and nothing else (400): django-filter's BooleanFilter quietly
    ignores a value it cannot read, which turns a typo into "no filter"."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("choices", [("true", "true"), ("false", "false")])
        kwargs.setdefault("coerce", lambda value: value == "true")
        super().__init__(*args, **kwargs)
