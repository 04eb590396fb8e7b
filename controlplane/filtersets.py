import datetime

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

from controlplane.choices import AuditOutcome, AuditSource, OperationState
from controlplane.models import AuditEvent, Event, Operation


class _UTCDateTimeField(IsoDateTimeField):
    def to_python(self, value):
        value = super().to_python(value)
        try:
            return value.astimezone(datetime.UTC) if value is not None else None
        except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None


class UTCDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 date-time, handed to the database in UTC: PostgreSQL refuses the offsets
    beyond ±15:59 that ISO 8601 and Python allow."""

    field_class = _UTCDateTimeField


class AuditEventFilterSet(django_filters.FilterSet):
    action = django_filters.CharFilter(lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor_name")
    source = django_filters.ChoiceFilter(choices=AuditSource.choices)
    outcome = django_filters.ChoiceFilter(choices=AuditOutcome.choices)
    object_type = django_filters.CharFilter()
    object_id = django_filters.CharFilter()
    since = UTCDateTimeFilter(field_name="at", lookup_expr="gte")
    until = UTCDateTimeFilter(field_name="at", lookup_expr="lt")
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


class EventFilterSet(django_filters.FilterSet):
    """A project's events: of one kind, about one object, recorded at or after ``since`` and
    before ``until`` (ISO 8601; UTC unless the value names a zone)."""

    since = UTCDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UTCDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Event
        fields = ["kind", "object_id"]
