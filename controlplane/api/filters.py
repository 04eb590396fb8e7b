from django_filters import CharFilter
from django_filters.rest_framework import DjangoFilterBackend

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
