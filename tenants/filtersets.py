import django_filters

from tenants.choices import ProjectStatus, Role
from tenants.models import Membership, Project


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
