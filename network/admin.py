"""The operators' console for networks: every network object is on view, nothing is edited
by hand. What operators do goes through ``network.services`` (and so is checked and audited,
source ``admin``, like the API): create and delete global IP pools, approve or reject
external connections; and a host behind on its desired state can be sent it again.

List pages select their related rows up front, so a page costs the same queries whatever
its length.
"""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, F, OuterRef, Subquery

from controlplane.admin import ReadOnlyAdmin
from controlplane.errors import KumoError
from network import services, sync
from network.models import (
    ExternalConnection,
    FixedIp,
    GlobalIp,
    GlobalIpPool,
    HostNetwork,
    Network,
    Port,
    PortForward,
    Router,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# --- networks, subnets, ports -----------------------------------------------------------------


class SubnetInline(ReadOnlyInline):
    model = Subnet
    fields = ["cidr", "name", "gateway_ip", "pool_start", "pool_end", "dns_servers"]
    readonly_fields = fields


@admin.register(Network)
class NetworkAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "kind", "vni", "mtu", "external_access", "created_at"]
    list_filter = ["kind", "external_access"]
    search_fields = ["name", "vni", "project__slug", "id"]
    list_select_related = ["project"]
    inlines = [SubnetInline]


@admin.register(Subnet)
class SubnetAdmin(ReadOnlyAdmin):
    list_display = ["cidr", "name", "network", "project", "gateway_ip", "pool_start", "pool_end"]
    search_fields = ["cidr", "name", "network__name", "project__slug"]
    list_select_related = ["network", "project"]


class FixedIpInline(ReadOnlyInline):
    model = FixedIp
    fields = ["address", "subnet"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("subnet")


@admin.register(Port)
class PortAdmin(ReadOnlyAdmin):
    list_display = [
        "__str__",
        "project",
        "network",
        "addresses",
        "vm",
        "host",
        "binding",
        "port_security",
        "bound_generation",
        "created_at",
    ]
    list_filter = ["binding", "port_security"]
    search_fields = ["id", "name", "mac", "fixed_ips__address", "project__slug", "vm__name"]
    list_select_related = ["project", "network", "vm", "host"]
    inlines = [FixedIpInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("fixed_ips")

    @admin.display(description="addresses")
    def addresses(self, port):
        return ", ".join(sorted(ip.address for ip in port.fixed_ips.all())) or "-"


# --- security groups --------------------------------------------------------------------------


class SecurityGroupRuleInline(ReadOnlyInline):
    model = SecurityGroupRule
    fk_name = "group"
    fields = [
        "direction",
        "protocol",
        "port_min",
        "port_max",
        "remote_cidr",
        "remote_group",
        "description",
    ]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("remote_group")


@admin.register(SecurityGroup)
class SecurityGroupAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "rule_count", "description", "created_at"]
    search_fields = ["name", "project__slug", "description"]
    list_select_related = ["project"]
    inlines = [SecurityGroupRuleInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(rule_count=Count("rules"))

    @admin.display(description="rules", ordering="rule_count")
    def rule_count(self, group):
        return group.rule_count


# --- global IPs and NAT -----------------------------------------------------------------------


class GlobalIpPoolAddForm(forms.ModelForm):
    """Adding a pool is the service's work: it checks the range (the gateway and the pool
    inside it, no overlap with another pool), and its refusal becomes this form's errors.

    The pool is created while the form is validated, because only the service can say
    whether it is valid. The admin's add view is one transaction, so the pool commits with
    the page's success or not at all.
    """

    pool_start = forms.GenericIPAddressField(
        protocol="IPv4", required=False, help_text="blank: the first host address"
    )
    pool_end = forms.GenericIPAddressField(
        protocol="IPv4", required=False, help_text="blank: the last host address"
    )

    class Meta:
        model = GlobalIpPool
        fields = ["name", "cidr", "gateway_ip", "pool_start", "pool_end"]

    def _post_clean(self):
        super()._post_clean()  # the model's own field checks (a slug, IPv4 addresses)
        if self.errors:
            return
        data = self.cleaned_data
        try:
            with transaction.atomic():
                self.instance = services.global_ip_pool_create(
                    name=data["name"],
                    cidr=data["cidr"],
                    gateway_ip=data["gateway_ip"],
                    pool_start=data.get("pool_start") or "",
                    pool_end=data.get("pool_end") or "",
                )
        except KumoError as e:
            placed = False
            for field, reasons in e.details.items():
                if field in self.fields:
                    for reason in reasons:
                        self.add_error(field, reason)
                    placed = True
            if not placed:
                self.add_error(None, e.message)


@admin.register(GlobalIpPool)
class GlobalIpPoolAdmin(admin.ModelAdmin):
    """Pools are created and deleted through the services, never edited: addresses have
    been handed out from them."""

    form = GlobalIpPoolAddForm
    list_display = [
        "name",
        "cidr",
        "gateway_ip",
        "pool_start",
        "pool_end",
        "addresses_in_use",
        "created_at",
    ]
    search_fields = ["name", "cidr"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(addresses_in_use=Count("addresses"))

    @admin.display(description="addresses in use", ordering="addresses_in_use")
    def addresses_in_use(self, pool):
        return pool.addresses_in_use

    def has_change_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        """Nothing to save: the add form created the pool through the service (and a
        pool is never changed)."""

    def delete_model(self, request, obj):
        try:
            services.global_ip_pool_delete(pool=obj)
        except KumoError as e:
            self.message_user(request, f"{obj.name}: {e.message}", level=messages.ERROR)

    def delete_queryset(self, request, queryset):
        for pool in queryset:
            self.delete_model(request, pool)


@admin.register(GlobalIp)
class GlobalIpAdmin(ReadOnlyAdmin):
    list_display = ["address", "pool", "project", "port", "router", "description", "created_at"]
    list_filter = ["pool", "router"]
    search_fields = ["address", "project__slug", "port__id", "port__mac"]
    list_select_related = ["pool", "project", "port"]


@admin.register(PortForward)
class PortForwardAdmin(ReadOnlyAdmin):
    list_display = [
        "__str__",
        "project",
        "global_ip",
        "protocol",
        "external_port",
        "port",
        "internal_port",
        "created_at",
    ]
    list_filter = ["protocol"]
    search_fields = ["global_ip__address", "external_port", "project__slug", "port__mac"]
    list_select_related = ["project", "global_ip", "port"]


@admin.register(Router)
class RouterAdmin(ReadOnlyAdmin):
    list_display = ["id", "project", "external_address", "created_at"]
    search_fields = ["id", "project__slug"]
    list_select_related = ["project"]

    def get_queryset(self, request):
        own = GlobalIp.objects.filter(project=OuterRef("project"), router=True)
        return (
            super()
            .get_queryset(request)
            .annotate(external_address=Subquery(own.values("address")[:1]))
        )

    @admin.display(description="external address")
    def external_address(self, router):
        return router.external_address or "-"


# --- external connections ---------------------------------------------------------------------


@admin.register(ExternalConnection)
class ExternalConnectionAdmin(ReadOnlyAdmin):
    """Requests from projects wait here for an operator: approving realizes the link on the
    gateway host (``services.connection_review``, audited with the reviewer)."""

    list_display = [
        "name",
        "project",
        "kind",
        "state",
        "network",
        "vlan_id",
        "destination_cidr",
        "next_hop",
        "remote",
        "reviewed_by",
        "reviewed_at",
        "created_at",
    ]
    list_filter = ["state", "kind"]
    search_fields = ["name", "project__slug", "remote", "destination_cidr", "vlan_id"]
    list_select_related = ["project", "network", "reviewed_by"]
    actions = ["approve", "reject"]

    def _review(self, request, queryset, *, approve: bool) -> None:
        done = 0
        for connection in queryset.select_related("project"):
            try:
                services.connection_review(
                    connection=connection, approve=approve, actor=request.user
                )
            except KumoError as e:
                self.message_user(request, f"{connection.name}: {e.message}", level=messages.ERROR)
            else:
                done += 1
        if done:
            verb = "approved" if approve else "rejected"
            self.message_user(request, f"{done} connection(s) {verb}", level=messages.SUCCESS)

    @admin.action(description="Approve the selected requests")
    def approve(self, request, queryset):
        self._review(request, queryset, approve=True)

    @admin.action(description="Reject the selected requests")
    def reject(self, request, queryset):
        self._review(request, queryset, approve=False)


# --- host agents ------------------------------------------------------------------------------


class ConvergedFilter(admin.SimpleListFilter):
    title = "converged"
    parameter_name = "converged"

    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No: behind its desired state")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(applied_generation__gte=F("desired_generation"))
        if self.value() == "no":
            return queryset.filter(applied_generation__lt=F("desired_generation"))
        return queryset


@admin.register(HostNetwork)
class HostNetworkAdmin(ReadOnlyAdmin):
    """What each host's network agent reports, and how far it is behind. Resending is
    always safe: the agent applies a generation once and the state is the whole of it."""

    list_display = [
        "host",
        "vtep_address",
        "gateway",
        "converged",
        "desired_generation",
        "applied_generation",
        "applied_at",
        "reported_at",
        "last_error",
    ]
    list_filter = ["gateway", ConvergedFilter]
    search_fields = ["host__name", "vtep_address", "last_error"]
    list_select_related = ["host"]
    actions = ["resend_desired"]

    @admin.display(boolean=True, description="converged")
    def converged(self, row):
        return row.converged

    @admin.action(description="Resend the desired network state")
    def resend_desired(self, request, queryset):
        rows = list(queryset.select_related("host"))
        sent = sync.send_desired([row.host_id for row in rows])
        self.message_user(request, f"desired state sent to {sent} host(s)")
        missing = [row.host.name for row in rows if row.vtep_address is None]
        if missing:
            self.message_user(
                request,
                f"not sent to {', '.join(missing)}: no VTEP address reported yet",
                level=messages.WARNING,
            )
