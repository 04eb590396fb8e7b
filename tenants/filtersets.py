import django_filters

from controlplane.api.filters import StrictBooleanFilter
from controlplane.filtersets import UTCDateTimeFilter
from tenants.choices import BillingPriority, PointsKind, ProjectStatus, Role, UsageResource
from tenants.models import (
    InstitutionReviewer,
    Invoice,
    Membership,
    PointsEntry,
    Project,
    UsageRecord,
)


class ProjectFilterSet(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=ProjectStatus.choices)
    q = django_filters.CharFilter(method="search", label="slug or name contains")

    class Meta:
        model = Project
        fields = ["status"]

    def search(self, queryset, name, value):
        from django.db.models import Q

        return queryset.filter(Q(slug__icontains=value) | Q(name__icontains=value))


class MembershipFilterSet(django_filters.FilterSet):
    role = django_filters.ChoiceFilter(choices=Role.choices)
    username = django_filters.CharFilter(field_name="user__username")

    class Meta:
        model = Membership
        fields = ["role", "username"]


class InstitutionReviewerFilterSet(django_filters.FilterSet):
    user = django_filters.CharFilter(field_name="user__username", label="the reviewer's username")
    issuer = django_filters.CharFilter()

    class Meta:
        model = InstitutionReviewer
        fields = ["user", "issuer"]


# --- billing -----------------------------------------------------------------------------------


class UsageRecordFilterSet(django_filters.FilterSet):
    resource = django_filters.ChoiceFilter(choices=UsageResource.choices)
    priority = django_filters.ChoiceFilter(choices=BillingPriority.choices)
    subject_type = django_filters.CharFilter()
    subject_id = django_filters.CharFilter()
    # true or false; anything else (null included) is a 400, never an ignored filter
    open = StrictBooleanFilter(field_name="ended_at", lookup_expr="isnull", label="still open")
    started_after = UTCDateTimeFilter(field_name="started_at", lookup_expr="gte")
    started_before = UTCDateTimeFilter(field_name="started_at", lookup_expr="lt")

    class Meta:
        model = UsageRecord
        fields = ["resource", "priority", "subject_type", "subject_id"]


class InvoiceFilterSet(django_filters.FilterSet):
    period_start = django_filters.DateFilter()

    class Meta:
        model = Invoice
        fields = ["period_start"]


class OperatorInvoiceFilterSet(InvoiceFilterSet):
    project = django_filters.CharFilter(field_name="project__slug")

    class Meta(InvoiceFilterSet.Meta):
        fields = ["period_start", "project"]


class PointsEntryFilterSet(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=PointsKind.choices)

    class Meta:
        model = PointsEntry
        fields = ["kind"]
