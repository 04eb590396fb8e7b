"""The portal's forms. They check the shape of the input (types, required fields) and offer
only what the caller's project holds (every choice is a project-scoped queryset); the
rules themselves are the services', whose errors land back on these forms
(``access.form_error``)."""

from django import forms
from django.conf import settings
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from compute.choices import HostState, ImageFormat, PlacementPolicy, Priority, VmState
from compute.leases import HOLDING
from compute.models import Image, Lease, PlacementGroup, Template, VirtualMachine
from controlplane.validators import hostname_validator
from network.choices import ConnectionKind, Direction, ForwardProtocol, Protocol
from network.models import GlobalIp, Network, Port, SecurityGroup
from storage.choices import ShareTier, VolumeTier
from storage.models import bucket_name_validator
from tenants.choices import BudgetPolicy, Role
from tenants.models import Quota, SSHKey

NAME_HELP = _("Lower-case letters, digits and hyphens.")


def name_field(**kwargs) -> forms.CharField:
    """A VM's, network's or volume's name: checked as the API's serializers check it (the
    model's validator), since the services take names as given."""
    return forms.CharField(
        max_length=63, validators=[hostname_validator], help_text=NAME_HELP, **kwargs
    )


class VmCreateForm(forms.Form):
    name = name_field(label=_("Name"))
    template = forms.ModelChoiceField(
        label=_("Template"), queryset=Template.objects.filter(active=True), to_field_name="name"
    )
    image = forms.ModelChoiceField(label=_("Image"), queryset=Image.objects.none())
    priority = forms.ChoiceField(
        label=_("Priority"), choices=Priority.choices, initial=Priority.ON_DEMAND
    )
    network = forms.ModelChoiceField(
        label=_("Network"),
        queryset=Network.objects.none(),
        required=False,
        empty_label=_("(no network)"),
    )
    ssh_keys = forms.ModelMultipleChoiceField(
        queryset=SSHKey.objects.none(),
        required=False,
        to_field_name="name",
        widget=forms.CheckboxSelectMultiple,
        label=_("SSH keys"),
    )
    user_data = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 4}), label=_("cloud-init user-data")
    )
    placement_group = forms.ModelChoiceField(
        label=_("Placement group"),
        queryset=PlacementGroup.objects.none(),
        required=False,
        empty_label=_("(none)"),
    )
    lease = forms.ModelChoiceField(
        label=_("Lease"),
        queryset=Lease.objects.none(),
        required=False,
        empty_label=_("(no lease)"),
        help_text=_("A GPU reservation of the project: the VM runs on its GPUs from its start."),
    )

    def __init__(self, *args, project, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["image"].queryset = Image.objects.usable_by(project)
        self.fields["network"].queryset = Network.objects.for_project(project)
        self.fields["ssh_keys"].queryset = SSHKey.objects.filter(user=user)
        self.fields["placement_group"].queryset = PlacementGroup.objects.for_project(project)
        self.fields["lease"].queryset = Lease.objects.for_project(project).filter(state__in=HOLDING)


class NetworkForm(forms.Form):
    name = name_field(label=_("Name"))
    cidr = forms.CharField(
        max_length=18, required=False, label=_("Subnet CIDR"), help_text=_("e.g. 10.0.0.0/24")
    )
    external_access = forms.BooleanField(required=False, label=_("Outbound access (SNAT)"))
    description = forms.CharField(label=_("Description"), max_length=200, required=False)


class SecurityGroupForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=63)
    description = forms.CharField(label=_("Description"), max_length=200, required=False)


class RuleForm(forms.Form):
    direction = forms.ChoiceField(
        label=_("Direction"), choices=Direction.choices, initial=Direction.INGRESS
    )
    protocol = forms.ChoiceField(
        label=_("Protocol"), choices=Protocol.choices, initial=Protocol.TCP
    )
    port_min = forms.IntegerField(
        min_value=1, max_value=65535, required=False, label=_("From port")
    )
    port_max = forms.IntegerField(min_value=1, max_value=65535, required=False, label=_("To port"))
    remote_cidr = forms.CharField(max_length=18, required=False, label=_("Remote CIDR"))
    description = forms.CharField(label=_("Description"), max_length=200, required=False)


class GlobalIpForm(forms.Form):
    description = forms.CharField(label=_("Description"), max_length=200, required=False)


class PortForwardForm(forms.Form):
    global_ip = forms.ModelChoiceField(queryset=GlobalIp.objects.none(), label=_("Global IP"))
    protocol = forms.ChoiceField(label=_("Protocol"), choices=ForwardProtocol.choices)
    external_port = forms.IntegerField(label=_("External port"), min_value=1, max_value=65535)
    port = forms.ModelChoiceField(queryset=Port.objects.none(), label=_("To the port of"))
    internal_port = forms.IntegerField(label=_("Internal port"), min_value=1, max_value=65535)
    description = forms.CharField(label=_("Description"), max_length=200, required=False)

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["global_ip"].queryset = GlobalIp.objects.for_project(project).filter(
            router=False
        )
        self.fields["port"].queryset = (
            Port.objects.for_project(project).select_related("vm").prefetch_related("fixed_ips")
        )
        self.fields["port"].label_from_instance = _port_label


def _port_label(port: Port) -> str:
    addresses = ", ".join(ip.address for ip in port.fixed_ips.all()) or "no address"
    return f"{port.vm.name if port.vm else port.name or port.pk} ({addresses})"


class SubnetForm(forms.Form):
    cidr = forms.CharField(max_length=18, label=_("CIDR"), help_text=_("e.g. 10.0.1.0/24"))
    name = forms.CharField(label=_("Name"), max_length=63, required=False)
    gateway_ip = forms.GenericIPAddressField(
        protocol="IPv4",
        required=False,
        label=_("Gateway"),
        help_text=_("Default: the first address."),
    )
    dns_servers = forms.CharField(
        max_length=100,
        required=False,
        label=_("DNS servers"),
        help_text=_("Space- or comma-separated; empty: the network's own resolver."),
    )

    def clean_gateway_ip(self):
        return self.cleaned_data["gateway_ip"] or ""  # the service's "default" is ""

    def clean_dns_servers(self):
        return self.cleaned_data["dns_servers"].replace(",", " ").split()


def _security_groups_field(help_text) -> forms.ModelMultipleChoiceField:
    """Ticks of the project's security groups, by name (``_ProjectGroups`` offers them)."""
    return forms.ModelMultipleChoiceField(
        queryset=SecurityGroup.objects.none(),
        required=False,
        to_field_name="name",
        widget=forms.CheckboxSelectMultiple,
        label=_("Security groups"),
        help_text=help_text,
    )


class _ProjectGroups:
    """A form whose ``security_groups`` offers the groups of its ``project``."""

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["security_groups"].queryset = SecurityGroup.objects.for_project(
            project
        ).order_by("name")


class PortCreateForm(_ProjectGroups, forms.Form):
    name = forms.CharField(label=_("Name"), max_length=63, required=False)
    fixed_ip = forms.GenericIPAddressField(
        protocol="IPv4",
        required=False,
        label=_("Fixed IP"),
        help_text=_("Default: the next free one."),
    )
    security_groups = _security_groups_field(_("None ticked: the project's default group."))
    port_security = forms.BooleanField(
        required=False, initial=True, label=_("Port security (security groups apply)")
    )

    def clean_fixed_ip(self):
        return self.cleaned_data["fixed_ip"] or ""

    def clean_security_groups(self):
        groups = self.cleaned_data["security_groups"]
        return [g.name for g in groups] or None  # the service's None: the default group


class PortSecurityForm(_ProjectGroups, forms.Form):
    """A port's security groups and whether they apply: ``network.services.port_update``,
    as the API's ``PATCH …/ports/{id}/``. No group ticked is no group (not the default)."""

    security_groups = _security_groups_field(
        _("Each lets in (and out) the flows its rules allow; none ticked lets none.")
    )
    port_security = forms.BooleanField(
        required=False, label=_("Port security (security groups apply)")
    )

    def clean_security_groups(self):
        return sorted(g.name for g in self.cleaned_data["security_groups"])


class OutboundForm(forms.Form):
    external_access = forms.BooleanField(required=False, label=_("Outbound access (SNAT)"))


class AssociateForm(forms.Form):
    """1:1 NAT: a global address to a VM's port."""

    global_ip = forms.ModelChoiceField(queryset=GlobalIp.objects.none(), label=_("Global IP"))
    port = forms.ModelChoiceField(queryset=Port.objects.none(), label=_("To the VM (port)"))

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["global_ip"].queryset = GlobalIp.objects.for_project(project).filter(
            router=False, port__isnull=True
        )
        self.fields["port"].queryset = (
            Port.objects.for_project(project).select_related("vm").prefetch_related("fixed_ips")
        )
        self.fields["port"].label_from_instance = _port_label


class ConnectionForm(forms.Form):
    name = name_field(label=_("Name"))
    kind = forms.ChoiceField(label=_("Kind"), choices=ConnectionKind.choices)
    network = forms.ModelChoiceField(
        label=_("Network"),
        queryset=Network.objects.none(),
        required=False,
        empty_label=_("(none)"),
        help_text=_("L2VPN: the network carried on the VLAN."),
    )
    vlan_id = forms.IntegerField(min_value=1, max_value=4094, required=False, label=_("VLAN id"))
    destination_cidr = forms.CharField(
        max_length=18, required=False, label=_("Destination CIDR"), help_text=_("L3 route")
    )
    next_hop = forms.GenericIPAddressField(
        protocol="IPv4", required=False, label=_("Next hop"), help_text=_("L3 route")
    )
    remote = forms.CharField(max_length=200, required=False, label=_("The other end, in words"))

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["network"].queryset = Network.objects.for_project(project)

    def clean_next_hop(self):
        return self.cleaned_data["next_hop"] or None


class ReviewForm(forms.Form):
    note = forms.CharField(label=_("Note"), max_length=500, required=False)


class WebhookForm(forms.Form):
    url = forms.URLField(
        max_length=500,
        assume_scheme="https",
        label=_("URL"),
        help_text=_("Events are POSTed here."),
    )
    kinds = forms.CharField(
        max_length=500,
        required=False,
        label=_("Event kinds"),
        help_text=_("Comma-separated, e.g. vm.eviction_notice; empty: every kind."),
    )

    def clean_kinds(self):
        kinds = [k.strip() for k in self.cleaned_data["kinds"].split(",") if k.strip()]
        if any(len(k) > 64 for k in kinds) or len(kinds) > 32:
            raise forms.ValidationError(_("At most 32 kinds of at most 64 characters."))
        return kinds


class ProjectSettingsForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=200)
    description = forms.CharField(
        label=_("Description"), widget=forms.Textarea(attrs={"rows": 3}), required=False
    )
    valid_from = forms.DateField(
        required=False, label=_("Valid from"), widget=forms.DateInput(attrs={"type": "date"})
    )
    valid_until = forms.DateField(
        required=False, label=_("Valid until"), widget=forms.DateInput(attrs={"type": "date"})
    )


QUOTA_LABELS = {
    "vcpus": _("vCPUs"),
    "memory_gib": _("Memory (GiB)"),
    "gpus": _("GPUs"),
    "vms": _("VMs"),
    "networks": _("Networks"),
    "global_ips": _("Global IPs"),
    "storage_gib": _("Storage (GiB)"),
    "buckets": _("Buckets"),
}


class QuotaForm(forms.Form):
    """A project's limits (operators), one field a resource."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in Quota.RESOURCES:
            self.fields[name] = forms.IntegerField(min_value=0, label=QUOTA_LABELS.get(name, name))


class VolumeForm(forms.Form):
    name = name_field(label=_("Name"))
    size_gib = forms.IntegerField(min_value=1, label=_("Size (GiB)"))
    tier = forms.ChoiceField(label=_("Tier"), choices=VolumeTier.choices, initial=VolumeTier.SHARED)


class BucketForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=63, validators=[bucket_name_validator])
    quota_gib = forms.IntegerField(min_value=1, label=_("Quota (GiB)"))


class VolumeAttachForm(forms.Form):
    """Which of the project's VMs a volume attaches to (others are no choice)."""

    vm = forms.ModelChoiceField(queryset=VirtualMachine.objects.none(), label=_("VM"))

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["vm"].queryset = (
            VirtualMachine.objects.for_project(project)
            .exclude(state=VmState.DELETED)
            .order_by("name")
        )


class VolumeExtendForm(forms.Form):
    size_gib = forms.IntegerField(min_value=1, max_value=1_048_576, label=_("New size (GiB)"))


class ShareForm(forms.Form):
    """A shared file system (``storage.services.share_create``, as ``POST …/shares/``), on
    one of the tiers this site serves (``KUMO_SHARE_FAST``, ``KUMO_SHARE_LARGE``)."""

    name = forms.CharField(label=_("Name"), max_length=63, validators=[hostname_validator])
    tier = forms.ChoiceField(label=_("Tier"), choices=())
    quota_gib = forms.IntegerField(min_value=1, max_value=1_048_576, label=_("Quota (GiB)"))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tier"].choices = [
            (tier, label) for tier, label in ShareTier.choices if tier in settings.SHARE_TIERS
        ]


class ShareExtendForm(forms.Form):
    quota_gib = forms.IntegerField(min_value=1, max_value=1_048_576, label=_("New quota (GiB)"))


class BucketQuotaForm(forms.Form):
    quota_gib = forms.IntegerField(min_value=1, max_value=1_048_576, label=_("Quota (GiB)"))


class AccessKeyForm(forms.Form):
    description = forms.CharField(label=_("Description"), max_length=200, required=False)


class ImageUploadForm(forms.Form):
    """An image's record and its file, in one multipart POST: the view registers the
    record and streams the file into the image store (``compute.services.image_upload``,
    as the API's ``PUT …/file/`` does)."""

    name = forms.CharField(label=_("Name"), max_length=100)
    os_distro = forms.CharField(
        max_length=32, label=_("OS distribution"), help_text=_("e.g. debian")
    )
    os_version = forms.CharField(max_length=32, required=False, label=_("OS version"))
    format = forms.ChoiceField(
        label=_("Format"), choices=ImageFormat.choices, initial=ImageFormat.QCOW2
    )
    login_user = forms.CharField(
        max_length=32, required=False, label=_("Login user"), help_text=_("e.g. debian, ubuntu")
    )
    file = forms.FileField(label=_("Image file"))


class PlacementGroupForm(forms.Form):
    name = name_field(label=_("Name"))
    policy = forms.ChoiceField(label=_("Policy"), choices=PlacementPolicy.choices)


class LeaseForm(forms.Form):
    """A reservation: ``compute.services.lease_create`` decides whether the fleet holds it."""

    name = name_field(label=_("Name"))
    gpus = forms.IntegerField(min_value=1, max_value=4096, label=_("GPUs"), required=False)
    hosts = forms.IntegerField(
        min_value=1,
        max_value=512,
        label=_("Or whole hosts"),
        required=False,
        help_text=_("Every GPU of each host: for VMs that need a whole host."),
    )
    gpu_model = forms.ChoiceField(label=_("GPU model"), required=False)
    starts_at = forms.DateTimeField(
        label=_("Start"), widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    ends_at = forms.DateTimeField(
        label=_("End"), widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    lend_idle = forms.BooleanField(
        label=_("Lend idle GPUs to spot VMs"),
        required=False,
        initial=True,
        help_text=_(
            "While the lease is active, spot VMs may run on the GPUs its VMs leave idle; a VM "
            "of the lease then waits for their eviction notice before it starts."
        ),
    )

    def __init__(self, *args, models=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_model"].choices = [(m, m) for m in models]
        zone = timezone.get_current_timezone_name()  # how a naive time is read
        self.fields["starts_at"].label = _("Start (%(zone)s)") % {"zone": zone}
        self.fields["ends_at"].label = _("End (%(zone)s)") % {"zone": zone}

    def clean(self):
        v = super().clean()
        if v.get("starts_at") and v.get("ends_at") and v["ends_at"] <= v["starts_at"]:
            self.add_error("ends_at", _("The end must be after the start."))
        if (v.get("gpus") is None) == (v.get("hosts") is None) and not self.has_error("gpus"):
            self.add_error("gpus", _("Give either GPUs or whole hosts."))
        return v


class InviteForm(forms.Form):
    """Whom to invite: an address, never a username (nothing is looked up by it)."""

    email = forms.EmailField(max_length=254, label=_("E-mail address"))
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)


class SSHKeyForm(forms.Form):
    name = forms.CharField(
        label=_("Name"), max_length=100, required=False, help_text=_("Default: the key's comment.")
    )
    public_key = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), label=_("Public key"))


class TokenForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    project = forms.ChoiceField(required=False, label=_("Only for project"))
    expires_at = forms.DateTimeField(
        required=False,
        label=_("Expires"),
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )

    def __init__(self, *args, projects, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [("", _("(every project of mine)"))] + [
            (p.slug, p.slug) for p in projects
        ]


class BudgetForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=63)
    amount = forms.DecimalField(label=_("Amount"), max_digits=19, decimal_places=6, min_value=0)
    thresholds = forms.CharField(
        label=_("Thresholds"),
        initial="50, 80, 100",
        help_text=_("Percent of the amount, comma-separated."),
    )
    policy = forms.ChoiceField(
        label=_("Policy"), choices=BudgetPolicy.choices, initial=BudgetPolicy.NOTIFY
    )

    def clean_thresholds(self):
        try:
            return [int(t) for t in self.cleaned_data["thresholds"].split(",") if t.strip()]
        except ValueError:
            raise forms.ValidationError(_("Whole percentages, e.g. 50, 80, 100.")) from None


class HostStateForm(forms.Form):
    state = forms.ChoiceField(
        label=_("State"),
        choices=[
            (HostState.DRAINING, _("Drain")),
            (HostState.MAINTENANCE, _("Maintenance")),
            (HostState.UP, _("Return to service")),
        ],
    )
    reason = forms.CharField(label=_("Reason"), max_length=200, required=False)
