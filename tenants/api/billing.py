"""The billing API: a project's usage records, invoices (with CSV and JSON downloads and a
recompute check), budgets, points ledger and forecast; operators' rate cards, invoice
issuing and points grants. Every write goes through ``tenants.billing``."""

from decimal import Decimal

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
    inline_serializer,
)
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.api import fields
from controlplane.api.viewsets import OperatorViewSet, ProjectScopedViewSet
from tenants import billing
from tenants.choices import BudgetPolicy, PointsKind, Role, UsageResource
from tenants.filtersets import (
    InvoiceFilterSet,
    OperatorInvoiceFilterSet,
    PointsEntryFilterSet,
    UsageRecordFilterSet,
)
from tenants.models import (
    Budget,
    Invoice,
    PointsEntry,
    Project,
    RateCard,
    RateCardPrice,
    UsageRecord,
)

MONEY = {"max_digits": 19, "decimal_places": 6}


def _money(**kwargs):
    return serializers.DecimalField(**MONEY, **kwargs)


@extend_schema_field(
    {
        "type": "string",
        "format": "decimal",
        # a positive amount: digits with at least one that is not 0, no sign
        "pattern": r"^(?=.*[1-9])\d{0,13}(?:\.\d{0,6})?$",
        "description": "greater than 0",
    }
)
class PositiveMoneyField(serializers.DecimalField):
    """An amount that must be greater than 0 (the schema says so)."""


# --- serializers ----------------------------------------------------------------------------------


class UsageRecordSerializer(serializers.ModelSerializer):
    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "subject_type",
            "subject_id",
            "subject_name",
            "resource",
            "model",
            "priority",
            "quantity",
            "started_at",
            "ended_at",
        ]
        read_only_fields = fields


class InvoiceSerializer(serializers.ModelSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Invoice
        fields = [
            "id",
            "project",
            "period_start",
            "period_end",
            "currency",
            "total",
            "points_applied",
            "amount_due",
            "content_hash",
            "issued_at",
        ]
        read_only_fields = fields


VerifySerializer = inline_serializer(
    "InvoiceVerification",
    {
        "stored_hash": serializers.CharField(),
        "recomputed_hash": serializers.CharField(),
        "identical": serializers.BooleanField(),
    },
)


class BudgetSerializer(fields.ModelSerializer):
    amount = PositiveMoneyField(**MONEY, min_value=Decimal("0.000001"))
    thresholds = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=1000),
        min_length=1,
        max_length=20,
        required=False,
        help_text="percent of the amount, each alerting once a month; default [50, 80, 100]",
    )
    policy = serializers.ChoiceField(choices=BudgetPolicy.choices, required=False)

    class Meta:
        model = Budget
        fields = ["id", "name", "amount", "thresholds", "policy", "active", "created_at"]
        read_only_fields = ["id", "created_at"]
        extra_kwargs = {"name": {"max_length": 63}}
        validators = []  # the name's uniqueness is the service's 409


class PointsEntrySerializer(serializers.ModelSerializer):
    invoice = serializers.IntegerField(
        source="invoice_id", read_only=True, allow_null=True, help_text="the invoice it paid"
    )

    class Meta:
        model = PointsEntry
        fields = ["id", "kind", "amount", "balance_after", "invoice", "note", "created_at"]
        read_only_fields = fields


class ForecastLineSerializer(serializers.Serializer):
    resource = serializers.CharField()
    model = serializers.CharField()
    priority = serializers.CharField()
    rate_card = serializers.IntegerField()
    unit = serializers.CharField()
    quantity = serializers.CharField()
    unit_price = serializers.CharField()
    factor = serializers.CharField()
    amount = serializers.CharField()


class ForecastBudgetSerializer(serializers.Serializer):
    name = serializers.CharField()
    amount = _money()
    spent_percent = serializers.DecimalField(max_digits=12, decimal_places=2)
    projected_percent = serializers.DecimalField(max_digits=12, decimal_places=2)


@extend_schema_serializer(many=False)  # answered by a list action (one report)
class ForecastSerializer(serializers.Serializer):
    period_start = serializers.DateField()
    period_end = serializers.DateField()
    at = serializers.DateTimeField()
    currency = serializers.CharField()
    so_far = _money(help_text="rated usage of the month up to now")
    projected = _money(help_text="so far, plus open intervals running to the month's end")
    points_balance = _money()
    budgets = ForecastBudgetSerializer(many=True)
    lines = ForecastLineSerializer(many=True, help_text="the projected invoice's lines")


class RateCardPriceSerializer(serializers.ModelSerializer):
    resource = serializers.ChoiceField(choices=UsageResource.choices)
    model = fields.CharField(max_length=64, required=False, allow_blank=True, default="")
    unit_price = serializers.DecimalField(max_digits=20, decimal_places=6, min_value=Decimal(0))

    class Meta:
        model = RateCardPrice
        fields = ["resource", "model", "unit_price"]
        validators = []


class RateCardSerializer(serializers.ModelSerializer):
    prices = RateCardPriceSerializer(many=True)
    spot_factor = serializers.DecimalField(
        max_digits=6, decimal_places=4, min_value=Decimal(0), max_value=Decimal(10), required=False
    )
    reserved_factor = serializers.DecimalField(
        max_digits=6, decimal_places=4, min_value=Decimal(0), max_value=Decimal(10), required=False
    )
    held_factor = serializers.DecimalField(
        max_digits=6,
        decimal_places=4,
        min_value=Decimal(0),
        max_value=Decimal(10),
        required=False,
        help_text="factor on the unit price of what a stopped VM holds (GPUs, vCPUs, memory)",
    )
    currency = fields.CharField(min_length=3, max_length=3, required=False)
    notes = fields.CharField(max_length=500, required=False, allow_blank=True)

    class Meta:
        model = RateCard
        fields = [
            "id",
            "version",
            "valid_from",
            "valid_until",
            "currency",
            "spot_factor",
            "reserved_factor",
            "held_factor",
            "notes",
            "prices",
            "created_at",
        ]
        read_only_fields = ["id", "version", "valid_until", "created_at"]


class IssueSerializer(serializers.Serializer):
    period = serializers.RegexField(r"^[0-9]{4}-(0[1-9]|1[0-2])$", help_text="YYYY-MM")
    project = fields.CharField(
        max_length=40, required=False, help_text="one project's slug; all projects when absent"
    )


class PointsGrantSerializer(serializers.Serializer):
    project = fields.CharField(max_length=40)
    amount = _money()
    kind = serializers.ChoiceField(
        choices=[PointsKind.CREDIT, PointsKind.ADJUSTMENT], default=PointsKind.CREDIT
    )
    note = fields.CharField(max_length=200, required=False, allow_blank=True, default="")


class OperatorPointsEntrySerializer(PointsEntrySerializer):
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta(PointsEntrySerializer.Meta):
        fields = ["id", "project", *PointsEntrySerializer.Meta.fields[1:]]
        read_only_fields = fields


# --- downloads ------------------------------------------------------------------------------------


def _download(invoice: Invoice, kind: str) -> HttpResponse:
    name = f"kumo-invoice-{invoice.project.slug}-{invoice.period_start:%Y-%m}"
    if kind == "csv":
        body, content_type = billing.invoice_csv(invoice.document), "text/csv; charset=utf-8"
    else:
        body, content_type = invoice.document, "application/json"
    response = HttpResponse(body.encode(), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}.{kind}"'
    response["X-Content-SHA256"] = invoice.content_hash
    return response


class _InvoiceActions:
    """CSV and JSON downloads and the recompute check, on project and operator invoices."""

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR})
    @action(detail=True, methods=["get"], url_path="csv")
    def download_csv(self, request, *args, **kwargs):
        """The invoice as CSV (derived from its canonical JSON): a header, the lines, a
        total row."""
        return _download(self.get_object(), "csv")

    @extend_schema(responses={(200, "application/json"): OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"], url_path="json")
    def download_json(self, request, *args, **kwargs):
        """The invoice's canonical JSON document, the bytes its ``content_hash`` is of."""
        return _download(self.get_object(), "json")

    @extend_schema(responses=VerifySerializer)
    @action(detail=True, methods=["get"])
    def verify(self, request, *args, **kwargs):
        """Recompute the invoice from the usage and rate cards now in the database and
        compare: ``identical`` is true when the bytes are the same."""
        return Response(billing.invoice_verify(self.get_object()))


# --- project endpoints ----------------------------------------------------------------------------


class UsageRecordViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ProjectScopedViewSet):
    """The project's usage intervals, exact to the microsecond; ``ended_at`` is null while
    the resource is still in use."""

    model = UsageRecord
    serializer_class = UsageRecordSerializer
    filterset_class = UsageRecordFilterSet
    ordering_fields = ["started_at", "ended_at", "resource"]


class InvoiceViewSet(
    _InvoiceActions, mixins.ListModelMixin, mixins.RetrieveModelMixin, ProjectScopedViewSet
):
    """The project's monthly invoices, with CSV and JSON downloads and ``verify``."""

    model = Invoice
    serializer_class = InvoiceSerializer
    filterset_class = InvoiceFilterSet
    ordering_fields = ["period_start", "total"]

    def get_queryset(self):
        return super().get_queryset().select_related("project")


class BudgetViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    ProjectScopedViewSet,
):
    """The project's monthly budgets. Each threshold (percent of the amount) alerts once a
    month by event, webhook and mail to the project's admins; at 100 % the policy may stop
    spot VMs, then the others. Admins manage budgets."""

    model = Budget
    serializer_class = BudgetSerializer
    write_role = Role.ADMIN
    ordering_fields = ["name", "amount", "created_at"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    audit_object_type = "tenants.budget"

    def perform_create(self, serializer):
        serializer.instance = billing.budget_create(
            project=self.project, **serializer.validated_data
        )

    def perform_update(self, serializer):
        serializer.instance = billing.budget_update(
            budget=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        billing.budget_delete(budget=instance)


class PointsEntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ProjectScopedViewSet):
    """The project's prepaid points ledger, newest first: every credit, every invoice paid
    from it and every adjustment, each with the balance after it."""

    model = PointsEntry
    serializer_class = PointsEntrySerializer
    filterset_class = PointsEntryFilterSet
    ordering_fields = ["id", "created_at"]


class ForecastViewSet(ProjectScopedViewSet):
    """This month's spend so far and projected to the month's end, with each budget's
    share and the points balance."""

    model = Project
    pagination_class = None  # one report
    filter_backends = []

    @extend_schema(responses=ForecastSerializer)
    def list(self, request, *args, **kwargs):
        return Response(ForecastSerializer(billing.forecast(self.project)).data)


# --- operators ------------------------------------------------------------------------------------


class OperatorRateCardViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, OperatorViewSet
):
    """Rate card versions. A new version starts at ``valid_from`` and ends the one before
    it there; exactly one is valid at any instant. Versions never change."""

    queryset = RateCard.objects.prefetch_related("prices")
    serializer_class = RateCardSerializer
    audit_object_type = "tenants.ratecard"

    def perform_create(self, serializer):
        v = dict(serializer.validated_data)
        optional = ("spot_factor", "reserved_factor", "held_factor", "currency", "notes")
        serializer.instance = billing.rate_card_create(
            valid_from=v["valid_from"],
            prices=[dict(p) for p in v["prices"]],
            actor=self.request.user,
            **{k: v[k] for k in optional if k in v},
        )


class OperatorInvoiceViewSet(
    _InvoiceActions, mixins.ListModelMixin, mixins.RetrieveModelMixin, OperatorViewSet
):
    """Every project's invoices; ``issue`` rates a month that has ended into invoices."""

    queryset = Invoice.objects.select_related("project")
    serializer_class = InvoiceSerializer
    filterset_class = OperatorInvoiceFilterSet
    ordering_fields = ["period_start", "total"]
    audit_object_type = "tenants.invoice"

    @extend_schema(request=IssueSerializer, responses={201: InvoiceSerializer(many=True)})
    @action(detail=False, methods=["post"])
    def issue(self, request):
        """Issue the invoices of ``period`` for every project with usage in it (or one
        project). Issuing again changes nothing; answers the invoices made now."""
        data = IssueSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        period = billing.parse_period(data.validated_data["period"])
        projects = None
        if data.validated_data.get("project"):
            slug = data.validated_data["project"]
            project = Project.objects.filter(slug=slug).first()
            if project is None:
                raise serializers.ValidationError({"project": f"no project {slug!r}"})
            projects = [project]
        made = billing.invoices_issue(period=period, projects=projects, actor=request.user)
        return Response(InvoiceSerializer(made, many=True).data, status=status.HTTP_201_CREATED)


class OperatorPointsViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, OperatorViewSet):
    """Every project's points ledger; operators credit points (a purchase, a grant) or
    adjust them. The balance never goes below zero (409)."""

    queryset = PointsEntry.objects.select_related("project")
    serializer_class = OperatorPointsEntrySerializer
    filterset_class = PointsEntryFilterSet
    audit_object_type = "tenants.pointsentry"

    @extend_schema(request=PointsGrantSerializer, responses={201: OperatorPointsEntrySerializer})
    def create(self, request):
        data = PointsGrantSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        project = Project.objects.filter(slug=v["project"]).first()
        if project is None:
            raise serializers.ValidationError({"project": f"no project {v['project']!r}"})
        entry = billing.points_credit(
            project=project, amount=v["amount"], kind=v["kind"], note=v["note"], actor=request.user
        )
        return Response(OperatorPointsEntrySerializer(entry).data, status=status.HTTP_201_CREATED)
