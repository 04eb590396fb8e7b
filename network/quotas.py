"""Network's part of project quotas: networks, and the global IPs the project holds (the
router's own address counts against nothing), counted in one query."""

from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce

from network.models import GlobalIp, Network
from tenants import quotas
from tenants.models import Project


def _count(model, **filters):
    rows = (
        model.objects.filter(project=OuterRef("pk"), **filters)
        .order_by()
        .values("project")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(rows), 0)


def _usage(project) -> dict[str, int]:
    row = (
        Project.objects.filter(pk=project.pk)
        .annotate(networks=_count(Network), global_ips=_count(GlobalIp, router=False))
        .values("networks", "global_ips")
        .get()
    )
    return dict(row)


def register() -> None:
    quotas.register_usage_counts(_usage, ("networks", "global_ips"))
