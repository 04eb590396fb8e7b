"""The operators' console for people and projects. Every save goes through a service, so the
admin is audited and checked like the API."""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from controlplane import audit
from controlplane.errors import KumoError
from tenants import billing, reviewers, services
from tenants.choices import UsageResource
from tenants.models import (
    ApiToken,
    Budget,
    BudgetAlert,
    ExternalIdentity,
    InstitutionReviewer,
    Invoice,
    Membership,
    PointsEntry,
    Project,
    Quota,
    RateCard,
    RateCardPrice,
    SSHKey,
    UsageRecord,
    User,
)


class ServiceAdmin(admin.ModelAdmin):
    """Turns a service's refusal into an error message instead of a 500."""

    def _run(self, request, fn, **kwargs):
        try:
            return fn(**kwargs)
        except KumoError as e:
            self.message_user(request, e.message, level=messages.ERROR)
            return None


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """Django's user admin; its changes are audited through the admin's own log hooks."""

    list_filter = [*DjangoUserAdmin.list_filter]

    def log_addition(self, request, obj, message):
        audit.record("user.create", obj)
        return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        audit.record("user.update", obj, detail={"change": str(message)[:500]})
        return super().log_change(request, obj, message)

    def log_deletions(self, request, queryset):
        for obj in queryset:
            audit.record("user.delete", obj)
        return super().log_deletions(request, queryset)


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(admin.ModelAdmin):
    list_display = ["user", "issuer", "subject", "created_at"]
    search_fields = ["user__username", "issuer", "subject"]
    list_filter = ["issuer"]


class InstitutionReviewerForm(forms.ModelForm):
    class Meta:
        model = InstitutionReviewer
        fields = ["user", "issuer"]
        help_texts = {
            "issuer": "The institution: its SAML IdP's entity ID or its OIDC issuer (not its "
            "name). The user reviews applications of people with an identity there."
        }

    def clean_issuer(self):
        try:
            return reviewers.issuer_check(self.cleaned_data.get("issuer", ""))
        except KumoError as e:
            raise forms.ValidationError(e.details.get("issuer", [e.message])[0]) from None


@admin.register(InstitutionReviewer)
class InstitutionReviewerAdmin(ServiceAdmin):
    """Institutional reviewers: added and removed through ``tenants.reviewers`` (audited);
    a designation is never edited (remove it and add another)."""

    form = InstitutionReviewerForm
    list_display = ["user", "issuer", "created_by", "created_at"]
    list_filter = ["issuer"]
    search_fields = ["user__username", "issuer"]
    list_select_related = ["user", "created_by"]
    autocomplete_fields = ["user"]

    def get_readonly_fields(self, request, obj=None):
        return ["user", "issuer", "created_by", "created_at"] if obj else []

    def save_model(self, request, obj, form, change):
        if change:
            return
        created = self._run(
            request,
            reviewers.reviewer_designate,
            user=obj.user,
            issuer=obj.issuer,
            actor=request.user,
        )
        if created is not None:
            obj.pk = created.pk

    def delete_model(self, request, obj):
        self._run(request, reviewers.reviewer_remove, reviewer=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ["user", "role", "created_at"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(ServiceAdmin):
    list_display = ["slug", "name", "owner", "status", "valid_from", "valid_until", "created_at"]
    list_filter = ["status", "valid_until"]
    search_fields = ["slug", "name", "owner__username", "owner__email"]
    inlines = [MembershipInline]
    actions = ["suspend", "reactivate", "issue_last_month"]

    def get_readonly_fields(self, request, obj=None):
        return (
            ["slug", "owner", "created_at", "updated_at"] if obj else ["created_at", "updated_at"]
        )

    def save_model(self, request, obj, form, change):
        if not change:
            created = self._run(
                request,
                services.project_create,
                slug=obj.slug,
                name=obj.name,
                owner=obj.owner,
                description=obj.description,
                valid_from=obj.valid_from,
                valid_until=obj.valid_until,
            )
            if created is not None:
                obj.pk = created.pk
            return
        fields = {f: getattr(obj, f) for f in ("name", "description", "valid_from", "valid_until")}
        self._run(request, services.project_update, project=obj, **fields)
        if "status" in form.changed_data:
            self._run(
                request, services.project_set_status, project=obj, status=obj.status, reason="admin"
            )

    def delete_model(self, request, obj):
        self._run(request, services.project_delete, project=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)

    @admin.action(description="Suspend the selected projects")
    def suspend(self, request, queryset):
        for project in queryset:
            services.project_set_status(project=project, status="suspended", reason="admin")

    @admin.action(description="Issue last month's invoices of the selected projects")
    def issue_last_month(self, request, queryset):
        from datetime import timedelta

        from django.utils import timezone

        period = billing.month_start(billing.month_start(timezone.now().date()) - timedelta(1))
        made = self._run(
            request,
            billing.invoices_issue,
            period=period,
            projects=list(queryset),
            actor=request.user,
        )
        if made is not None:
            self.message_user(request, f"{len(made)} invoice(s) of {period:%Y-%m} issued")

    @admin.action(description="Reactivate the selected projects")
    def reactivate(self, request, queryset):
        for project in queryset:
            services.project_set_status(project=project, status="active", reason="admin")


@admin.register(Membership)
class MembershipAdmin(ServiceAdmin):
    list_display = ["project", "user", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["project__slug", "user__username", "user__email"]
    autocomplete_fields = ["project", "user"]

    def get_readonly_fields(self, request, obj=None):
        return ["project", "user", "created_at"] if obj else ["created_at"]

    def save_model(self, request, obj, form, change):
        if change:
            self._run(request, services.membership_update, membership=obj, role=obj.role)
        else:
            created = self._run(
                request, services.membership_add, project=obj.project, user=obj.user, role=obj.role
            )
            if created is not None:
                obj.pk = created.pk

    def delete_model(self, request, obj):
        self._run(request, services.membership_remove, membership=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(Quota)
class QuotaAdmin(ServiceAdmin):
    list_display = ["project", *Quota.RESOURCES]
    search_fields = ["project__slug"]
    readonly_fields = ["project", "updated_at"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        limits = {name: getattr(obj, name) for name in Quota.RESOURCES}
        self._run(request, services.quota_set, project=obj.project, **limits)


@admin.register(SSHKey)
class SSHKeyAdmin(ServiceAdmin):
    list_display = ["user", "name", "key_type", "bits", "fingerprint", "created_at"]
    list_filter = ["key_type"]
    search_fields = ["user__username", "name", "fingerprint", "comment"]
    readonly_fields = [
        "user",
        "name",
        "public_key",
        "key_type",
        "bits",
        "fingerprint",
        "comment",
        "created_at",
    ]

    def has_add_permission(self, request):
        return False

    def delete_model(self, request, obj):
        services.sshkey_delete(key=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            services.sshkey_delete(key=obj)


@admin.register(ApiToken)
class ApiTokenAdmin(ServiceAdmin):
    list_display = ["name", "user", "prefix", "project", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at", "expires_at"]
    search_fields = ["name", "prefix", "user__username", "project__slug"]
    readonly_fields = [
        "user",
        "name",
        "prefix",
        "project",
        "expires_at",
        "last_used_at",
        "revoked_at",
        "created_at",
    ]
    exclude = ["digest"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.token_revoke(token=token)


# --- billing ------------------------------------------------------------------------------------


class RateCardForm(forms.ModelForm):
    """A new rate card version; its prices are typed one per line: ``resource [model] price``
    (``gpu A100-SXM4-40GB 500``, ``vcpu 10``)."""

    prices_text = forms.CharField(
        label="Prices",
        widget=forms.Textarea(attrs={"rows": 8}),
        help_text="one per line: resource [GPU model] unit price; resources: "
        + ", ".join(UsageResource.values)
        + " (storage per GiB-month, the others per unit-hour); a gpu line without a model "
        "prices every other GPU model",
    )

    class Meta:
        model = RateCard
        # held_factor: the model's default (0.5) here; the API sets another.
        fields = ["valid_from", "currency", "spot_factor", "reserved_factor", "notes"]

    def clean_prices_text(self):
        prices = []
        for number, line in enumerate(self.cleaned_data["prices_text"].splitlines(), start=1):
            words = line.split()
            if not words:
                continue
            if len(words) not in (2, 3):
                raise forms.ValidationError(f"line {number}: resource [model] price")
            prices.append(
                {
                    "resource": words[0],
                    "model": words[1] if len(words) == 3 else "",
                    "unit_price": words[-1],
                }
            )
        return prices


class RateCardPriceInline(admin.TabularInline):
    model = RateCardPrice
    extra = 0
    fields = ["resource", "model", "unit_price"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(RateCard)
class RateCardAdmin(ServiceAdmin):
    """Rate card versions: added through ``tenants.billing.rate_card_create`` (which ends
    the version before at the new one's start); never edited nor deleted."""

    list_display = ["version", "valid_from", "valid_until", "currency", "spot_factor"]

    def get_inlines(self, request, obj=None):
        return [RateCardPriceInline] if obj is not None else []

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = RateCardForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return [*RateCardForm.Meta.fields, "prices_text"]
        return ["version", "valid_from", "valid_until", *RateCardForm.Meta.fields[1:]]

    def get_readonly_fields(self, request, obj=None):
        return self.get_fields(request, obj) if obj else []

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        created = self._run(
            request,
            billing.rate_card_create,
            valid_from=obj.valid_from,
            prices=form.cleaned_data["prices_text"],
            spot_factor=obj.spot_factor,
            reserved_factor=obj.reserved_factor,
            held_factor=obj.held_factor,
            currency=obj.currency,
            notes=obj.notes,
            actor=request.user,
        )
        if created is not None:
            obj.pk = created.pk

    def save_related(self, request, form, formsets, change):
        pass  # the prices were written by the service


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = [
        "project",
        "subject_name",
        "resource",
        "model",
        "priority",
        "quantity",
        "started_at",
        "ended_at",
    ]
    list_filter = ["resource", "priority", "subject_type"]
    search_fields = ["project__slug", "subject_id", "subject_name"]
    list_select_related = ["project"]


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    list_display = ["project", "period_start", "total", "points_applied", "amount_due", "issued_at"]
    list_filter = ["period_start"]
    search_fields = ["project__slug", "content_hash"]
    list_select_related = ["project"]
    actions = ["verify"]

    @admin.action(description="Recompute the selected invoices and compare")
    def verify(self, request, queryset):
        for invoice in queryset.select_related("project"):
            try:
                check = billing.invoice_verify(invoice)
            except KumoError as e:
                self.message_user(request, f"{invoice}: {e.message}", level=messages.ERROR)
                continue
            if check["identical"]:
                self.message_user(request, f"{invoice}: identical ({check['stored_hash']})")
            else:
                self.message_user(
                    request,
                    f"{invoice}: DIFFERS: stored {check['stored_hash']}, "
                    f"recomputed {check['recomputed_hash']}",
                    level=messages.WARNING,
                )


@admin.register(Budget)
class BudgetAdmin(ServiceAdmin):
    list_display = ["project", "name", "amount", "thresholds", "policy", "active"]
    list_filter = ["policy", "active"]
    search_fields = ["project__slug", "name"]
    autocomplete_fields = ["project"]

    def get_readonly_fields(self, request, obj=None):
        return ["project"] if obj else []

    def save_model(self, request, obj, form, change):
        fields = {f: getattr(obj, f) for f in ("name", "amount", "thresholds", "policy", "active")}
        if change:
            self._run(request, billing.budget_update, budget=obj, **fields)
            return
        created = self._run(request, billing.budget_create, project=obj.project, **fields)
        if created is not None:
            obj.pk = created.pk

    def delete_model(self, request, obj):
        self._run(request, billing.budget_delete, budget=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin):
    list_display = ["budget", "period_start", "threshold", "spend", "created_at"]
    list_filter = ["period_start", "threshold"]
    list_select_related = ["budget__project"]


@admin.register(PointsEntry)
class PointsEntryAdmin(ServiceAdmin):
    """The points ledger: operators add credits and adjustments; entries never change."""

    list_display = ["project", "kind", "amount", "balance_after", "invoice", "note", "created_at"]
    list_filter = ["kind"]
    search_fields = ["project__slug", "note"]
    list_select_related = ["project"]
    autocomplete_fields = ["project"]
    fields = ["project", "kind", "amount", "note"]

    def get_readonly_fields(self, request, obj=None):
        return ["project", "kind", "amount", "balance_after", "invoice", "note"] if obj else []

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        if change:
            return
        created = self._run(
            request,
            billing.points_credit,
            project=obj.project,
            amount=obj.amount,
            kind=obj.kind,
            note=obj.note,
            actor=request.user,
        )
        if created is not None:
            obj.pk = created.pk
