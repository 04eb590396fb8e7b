"""Storage's part of project quotas, counted in one query: ``storage_gib`` is the GiB of
the project's volumes, the quotas of its shares and the quotas of its buckets;
``buckets`` the number of its buckets."""

from django.db.models import Count, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from storage.models import Bucket, Share, Volume
from tenants import quotas
from tenants.models import Project


def _total(model, field: str, how=Sum):
    rows = (
        model.objects.filter(project=OuterRef("pk"))
        .order_by()
        .values("project")
        .annotate(n=how(field))
        .values("n")
    )
    return Coalesce(Subquery(rows), 0)


def _usage(project) -> dict[str, int]:
    row = (
        Project.objects.filter(pk=project.pk)
        .annotate(
            volume_gib=_total(Volume, "size_gib"),
            share_gib=_total(Share, "quota_gib"),
            bucket_gib=_total(Bucket, "quota_gib"),
            bucket_count=_total(Bucket, "pk", Count),
        )
        .values("volume_gib", "share_gib", "bucket_gib", "bucket_count")
        .get()
    )
    return {
        "storage_gib": row["volume_gib"] + row["share_gib"] + row["bucket_gib"],
        "buckets": row["bucket_count"],
    }


def register() -> None:
    quotas.register_usage_counts(_usage, ("storage_gib", "buckets"))
