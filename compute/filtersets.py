import django_filters

from compute.choices import (
    DeviceKind,
    HostState,
    ImageState,
    LeaseState,
    Priority,
    Visibility,
    VmState,
)
from compute.models import Device, Host, Image, Lease, Template, VirtualMachine
from controlplane.api.filters import StrictBooleanFilter
from controlplane.filtersets import UTCDateTimeFilter


class HostFilterSet(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=HostState.choices)
    rack = django_filters.CharFilter()
    zone = django_filters.CharFilter()

    class Meta:
        model = Host
        fields = ["state", "rack", "zone"]


class DeviceFilterSet(django_filters.FilterSet):
    host = django_filters.CharFilter(field_name="host__name")
    kind = django_filters.ChoiceFilter(choices=DeviceKind.choices)
    allocated = StrictBooleanFilter(field_name="vm", lookup_expr="isnull", exclude=True)
    present = StrictBooleanFilter()

    class Meta:
        model = Device
        fields = ["host", "kind", "model", "present", "allocated"]


class ImageFilterSet(django_filters.FilterSet):
    visibility = django_filters.ChoiceFilter(choices=Visibility.choices)
    os_distro = django_filters.CharFilter()
    state = django_filters.ChoiceFilter(choices=ImageState.choices)

    class Meta:
        model = Image
        fields = ["visibility", "os_distro", "format", "state", "name"]


class VirtualMachineFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=VmState.choices)
    priority = django_filters.ChoiceFilter(choices=Priority.choices)
    host = django_filters.CharFilter(field_name="host__name")
    name = django_filters.CharFilter()

    class Meta:
        model = VirtualMachine
        fields = ["state", "priority", "host", "name"]


class TemplateFilterSet(django_filters.FilterSet):
    gpus = django_filters.TypedChoiceFilter(
        choices=[(n, str(n)) for n in (0, 1, 2, 4, 8)], coerce=int
    )
    spot_allowed = StrictBooleanFilter()

    class Meta:
        model = Template
        fields = ["gpus", "gpu_model", "spot_allowed"]


class LeaseFilterSet(django_filters.FilterSet):
    """A calendar's window: ``ends_after`` and ``starts_before`` keep the leases that overlap
    it."""

    state = django_filters.MultipleChoiceFilter(choices=LeaseState.choices)
    ends_after = UTCDateTimeFilter(field_name="ends_at", lookup_expr="gt")
    starts_before = UTCDateTimeFilter(field_name="starts_at", lookup_expr="lt")
    project = django_filters.CharFilter(field_name="project__slug")

    class Meta:
        model = Lease
        fields = ["state", "name", "gpu_model", "ends_after", "starts_before", "project"]
