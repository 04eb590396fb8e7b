"""Users, projects (Kumo's tenants), memberships, quotas, SSH keys and API tokens."""

from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from controlplane.querysets import ProjectOwnedQuerySet
from tenants.choices import (
    BillingPriority,
    BudgetPolicy,
    PointsKind,
    ProjectStatus,
    Role,
    SSHKeyType,
    UsageResource,
)

slug_validator = RegexValidator(
    r"^[a-z][a-z0-9-]{1,38}[a-z0-9]$",
    "3 to 40 characters: lower-case letters, digits and hyphens, starting with a letter "
    "and not ending with a hyphen.",
)


class User(AbstractUser):
    """A person: a password account, or one made just in time by a federated login (SAML or
    OIDC, bound through ExternalIdentity), or both. The profile fields are filled from the
    identity provider's attributes at each federated login."""

    email = models.EmailField("email address", blank=True, db_index=True)
    display_name = models.CharField(max_length=200, blank=True)
    organisation = models.CharField(max_length=200, blank=True)
    affiliation = models.CharField(max_length=200, blank=True)


class ExternalIdentity(models.Model):
    """A federated login bound to a user: ``issuer`` (the SAML IdP's entityID or the OIDC
    issuer) and ``subject`` (eduPersonPrincipalName, a persistent id, or the OIDC ``sub``).
    A login finds its user by this pair alone, never by e-mail."""

    class Kind(models.TextChoices):
        SAML = "saml", "SAML 2.0"
        OIDC = "oidc", "OpenID Connect"

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="external_identities")
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.SAML)
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    attributes = models.JSONField(default=dict, blank=True)
    last_login_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="unique_external_identity")
        ]
        verbose_name_plural = "external identities"

    def __str__(self):
        return f"{self.issuer}#{self.subject}"


class ProjectQuerySet(models.QuerySet):
    def visible_to(self, user, *, token=None):
        """Projects where ``user`` holds a role; with a project-scoped token, only that one."""
        if not user.is_authenticated:
            return self.none()
        qs = self.filter(memberships__user=user)
        if token is not None and token.project_id is not None:
            qs = qs.filter(pk=token.project_id)
        return qs


class Project(models.Model):
    """A tenant: one research project. Everything a tenant owns points here."""

    slug = models.SlugField(max_length=40, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(User, on_delete=models.PROTECT, related_name="owned_projects")
    status = models.CharField(
        max_length=16, choices=ProjectStatus.choices, default=ProjectStatus.ACTIVE
    )
    valid_from = models.DateField(null=True, blank=True)
    valid_until = models.DateField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(valid_until__isnull=True)
                | Q(valid_from__isnull=True)
                | Q(valid_until__gte=models.F("valid_from")),
                name="project_validity_ordered",
            )
        ]

    def __str__(self):
        return self.slug


class ProjectOwnedModel(models.Model):
    """Base of every tenant-owned model: it knows its project, and reads go through
    ``Model.objects.for_project(project)``, the scoped queryset the API's base viewset uses."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")

    objects = ProjectOwnedQuerySet.as_manager()

    class Meta:
        abstract = True


class Membership(ProjectOwnedModel):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="unique_membership")
        ]

    def __str__(self):
        return f"{self.user} in {self.project} ({self.role})"


class Quota(models.Model):
    """Limits of one project. Usage is never stored here: it is counted from what exists
    (``tenants.quotas.usage``), so it cannot drift."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="quota")
    vcpus = models.PositiveIntegerField(validators=[MinValueValidator(0)])
    memory_gib = models.PositiveIntegerField()
    gpus = models.PositiveIntegerField()
    vms = models.PositiveIntegerField()
    networks = models.PositiveIntegerField()
    global_ips = models.PositiveIntegerField()
    storage_gib = models.PositiveIntegerField()
    buckets = models.PositiveIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    RESOURCES = (
        "vcpus",
        "memory_gib",
        "gpus",
        "vms",
        "networks",
        "global_ips",
        "storage_gib",
        "buckets",
    )

    def __str__(self):
        return f"quota of {self.project}"

    def limits(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.RESOURCES}


class SSHKey(models.Model):
    """An SSH public key of a user, parsed and validated on the way in."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    public_key = models.TextField()
    key_type = models.CharField(max_length=32, choices=SSHKeyType.choices)
    bits = models.PositiveIntegerField()
    fingerprint = models.CharField(max_length=64, help_text="SHA256:… as ssh-keygen -l shows it")
    comment = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "fingerprint"], name="unique_user_key"),
            models.UniqueConstraint(fields=["user", "name"], name="unique_user_key_name"),
        ]
        verbose_name = "SSH key"

    def __str__(self):
        return f"{self.name} ({self.fingerprint})"


class ApiToken(models.Model):
    """A bearer token for the API. Only its SHA-256 is stored; the secret is shown once.

    ``prefix`` is the public part of the token (``kumo_<prefix>_<secret>``) and finds the row
    without a scan. A token scoped to a project sees that project alone.
    """

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


def default_quota() -> dict[str, int]:
    return dict(settings.DEFAULT_QUOTA)


# --- billing: rate cards, usage intervals, invoices, budgets, points ---------------------------

MONEY = {"max_digits": 20, "decimal_places": 6}  # prices and ledger amounts
QUANTITY = {"max_digits": 24, "decimal_places": 10}  # exact: memory MiB / 1024 needs 10 places


class RateCard(models.Model):
    """One version of the price list, valid over ``[valid_from, valid_until)``.

    Exactly one version is valid at any instant from the first one on: versions never
    overlap (an exclusion constraint on PostgreSQL, and at most one open-ended version on
    every database), and ``tenants.billing.rate_card_create`` is their only writer: it
    appends a version and closes the previous one where the new one starts, so the chain
    has no gap. A version never changes once created; a price change is a new version.
    """

    version = models.PositiveIntegerField(unique=True)
    valid_from = models.DateTimeField()
    valid_until = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3, default="JPY")
    spot_factor = models.DecimalField(
        max_digits=6, decimal_places=4, validators=[MinValueValidator(0), MaxValueValidator(10)]
    )
    reserved_factor = models.DecimalField(
        max_digits=6, decimal_places=4, validators=[MinValueValidator(0), MaxValueValidator(10)]
    )
    # The price of what a stopped VM holds (its GPUs, vCPUs and memory stay claimed): the
    # unit price times this factor (``BillingPriority.HELD``).
    held_factor = models.DecimalField(
        max_digits=6,
        decimal_places=4,
        default=Decimal("0.5"),
        validators=[MinValueValidator(0), MaxValueValidator(10)],
    )
    notes = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.CheckConstraint(
                condition=Q(valid_until__isnull=True) | Q(valid_until__gt=models.F("valid_from")),
                name="rate_card_validity_ordered",
            ),
            models.UniqueConstraint(
                fields=["valid_until"],
                condition=Q(valid_until__isnull=True),
                name="one_open_rate_card",
            ),
            models.CheckConstraint(
                condition=Q(spot_factor__gte=0) & Q(reserved_factor__gte=0),
                name="rate_card_factors_not_negative",
            ),
        ]

    def __str__(self):
        return f"rate card v{self.version}"

    def factor(self, priority: str):
        from decimal import Decimal

        if priority == BillingPriority.SPOT:
            return self.spot_factor
        if priority == BillingPriority.RESERVED:
            return self.reserved_factor
        if priority == BillingPriority.HELD:
            return self.held_factor
        return Decimal(1)


class RateCardPrice(models.Model):
    """The price of one resource in one rate card version, per unit-hour (storage: per
    GiB-month). GPUs are priced by ``model``; ``model=""`` is the price of any GPU model the
    card does not name."""

    card = models.ForeignKey(RateCard, on_delete=models.CASCADE, related_name="prices")
    resource = models.CharField(max_length=16, choices=UsageResource.choices)
    model = models.CharField(max_length=64, blank=True)
    unit_price = models.DecimalField(**MONEY, validators=[MinValueValidator(0)])

    class Meta:
        ordering = ["card", "resource", "model"]
        constraints = [
            models.UniqueConstraint(fields=["card", "resource", "model"], name="unique_price"),
            models.CheckConstraint(condition=Q(unit_price__gte=0), name="price_not_negative"),
            models.CheckConstraint(
                condition=Q(resource="gpu") | Q(model=""), name="only_gpus_have_models"
            ),
        ]

    def __str__(self):
        return f"{self.resource}{':' + self.model if self.model else ''} {self.unit_price}"


class UsageRecord(ProjectOwnedModel):
    """One exact usage interval ``[started_at, ended_at)`` of one resource of one subject
    (a VM, a global IP, a volume), ``ended_at`` null while it is open.

    Written only by ``tenants.usage`` in the transaction of the state change it follows.
    For one (subject, resource, model) at most one interval is open (a unique index) and a
    new one never starts before the last one ended (the writer's rule), so intervals of one
    subject and resource never overlap. The subject is named by type and id, not a foreign
    key: a bill outlives the deleted VM or released address it describes.
    """

    # Read by project through the (project, started_at) index: no index of the key alone,
    # which each interval written (a VM's claim writes three) would update for nothing.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    subject_type = models.CharField(max_length=64, help_text="e.g. compute.virtualmachine")
    subject_id = models.CharField(max_length=64)
    subject_name = models.CharField(max_length=200, blank=True)
    resource = models.CharField(max_length=16, choices=UsageResource.choices)
    model = models.CharField(max_length=64, blank=True, help_text="the GPU model")
    priority = models.CharField(
        max_length=16, choices=BillingPriority.choices, default=BillingPriority.ON_DEMAND
    )
    quantity = models.DecimalField(**QUANTITY)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                name="usage_interval_ordered",
            ),
            models.CheckConstraint(condition=Q(quantity__gt=0), name="usage_quantity_positive"),
            models.UniqueConstraint(
                fields=["subject_type", "subject_id", "resource", "model"],
                condition=Q(ended_at__isnull=True),
                name="one_open_usage_interval",
            ),
        ]
        indexes = [
            models.Index(fields=["project", "started_at"], name="usage_project_start"),
            models.Index(fields=["subject_type", "subject_id"], name="usage_subject"),
            models.Index(fields=["started_at", "ended_at"], name="usage_period"),
        ]

    def __str__(self):
        return f"{self.subject_name or self.subject_id} {self.resource} x{self.quantity}"


class DocumentField(models.TextField):
    """A text column for large documents (an invoice's canonical JSON). Bulk inserts send it
    as one plain parameter per row: Django would otherwise put every document in an array
    literal for UNNEST, escaping each quote on the client, which costs more than the
    rating itself when a month's thousand invoices are written at once."""

    def get_placeholder(self, value, compiler, connection):
        return "%s"


class Invoice(ProjectOwnedModel):
    """A project's bill for one calendar month (UTC), rated from its usage intervals.

    ``document`` is the canonical JSON of the rating (``tenants.billing``): the same
    intervals and rate cards always give the same bytes, and ``content_hash`` is their
    SHA-256, so the invoice can be recomputed at any time and compared. What the project's
    points paid of it and what is left are kept beside the document, not in it.
    """

    period_start = models.DateField(help_text="the first day of the month")
    period_end = models.DateField(help_text="the first day of the next month")
    currency = models.CharField(max_length=3)
    total = models.DecimalField(**MONEY)
    points_applied = models.DecimalField(**MONEY, default=0)
    amount_due = models.DecimalField(**MONEY)
    document = DocumentField(help_text="canonical JSON")
    content_hash = models.CharField(max_length=64, help_text="SHA-256 of the document")
    issued_at = models.DateTimeField()
    issued_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-period_start", "project"]
        constraints = [
            models.UniqueConstraint(fields=["project", "period_start"], name="one_invoice_a_month"),
            models.CheckConstraint(
                condition=Q(amount_due=models.F("total") - models.F("points_applied")),
                name="invoice_amount_due",
            ),
        ]

    def __str__(self):
        return f"invoice {self.project_id} {self.period_start:%Y-%m}"


class Budget(ProjectOwnedModel):
    """A monthly spending limit of a project with its alert thresholds (percent of
    ``amount``). Each threshold alerts at most once per month (``BudgetAlert``); at 100 %
    ``policy`` says what is stopped."""

    name = models.CharField(max_length=63)
    amount = models.DecimalField(**MONEY, validators=[MinValueValidator(0)])
    thresholds = models.JSONField(default=list, help_text="percent, ascending, e.g. [50, 80, 100]")
    policy = models.CharField(
        max_length=16, choices=BudgetPolicy.choices, default=BudgetPolicy.NOTIFY
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_budget_name"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="budget_amount_positive"),
        ]

    def __str__(self):
        return f"{self.name} ({self.amount})"


class BudgetAlert(models.Model):
    """That ``threshold`` of ``budget`` was crossed in the month of ``period_start``. The
    unique constraint is what makes each alert happen exactly once, however many checks
    run at the same time: the check that inserts the row emits the event."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateField()
    threshold = models.PositiveSmallIntegerField()
    spend = models.DecimalField(**MONEY)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_start", "threshold"], name="one_alert_per_threshold"
            )
        ]

    def __str__(self):
        return f"{self.budget} {self.threshold}% {self.period_start:%Y-%m}"


class PointsEntry(ProjectOwnedModel):
    """One movement of a project's prepaid points, with the balance after it. The balance
    is never a mutable total: it is the last entry's ``balance_after``, each entry written
    under the project's row lock, never below zero, and an invoice draws at most once."""

    kind = models.CharField(max_length=16, choices=PointsKind.choices)
    amount = models.DecimalField(**MONEY, help_text="signed: credits > 0, debits < 0")
    balance_after = models.DecimalField(**MONEY)
    invoice = models.ForeignKey(
        Invoice, null=True, blank=True, on_delete=models.RESTRICT, related_name="+"
    )
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "points entries"
        constraints = [
            models.CheckConstraint(condition=Q(balance_after__gte=0), name="points_not_negative"),
            models.UniqueConstraint(
                fields=["invoice"], condition=Q(invoice__isnull=False), name="one_draw_a_invoice"
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.amount} -> {self.balance_after}"
