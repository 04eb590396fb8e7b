import django_filters

from controlplane.choices import AuditOutcome, AuditSource, OperationState
from controlplane.models import AuditEvent, Operation


class AuditEventFilterSet(django_filters.FilterSet):
    action = django_filters.CharFilter(lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor_name")
    source = django_filters.ChoiceFilter(choices=AuditSource.choices)
    outcome = django_filters.ChoiceFilter(choices=AuditOutcome.choices)
    object_type = django_filters.CharFilter()
    object_id = django_filters.CharFilter()
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")
    project = django_filters.CharFilter(field_name="project_slug")

    class Meta:
        model = AuditEvent
        fields = ["action", "actor", "source", "outcome", "object_type", "object_id"]


class OperationFilterSet(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=OperationState.choices)
    kind = django_filters.CharFilter()
    target_type = django_filters.CharFilter()
    target_id = django_filters.CharFilter()

    class Meta:
        model = Operation
        fields = ["state", "kind", "target_type", "target_id"]
