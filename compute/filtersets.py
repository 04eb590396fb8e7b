import django_filters

from compute.choices import HostState
from compute.models import Host


class HostFilterSet(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=HostState.choices)
    rack = django_filters.CharFilter()
    zone = django_filters.CharFilter()

    class Meta:
        model = Host
        fields = ["state", "rack", "zone"]
