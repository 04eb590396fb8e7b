"""Networks (created with a subnet's CIDR) and each network's page (subnets, ports, outbound
access, DNS), security groups and their rules, global IPs (1:1 NAT and DNAT port forwards)
and external connections; every write through ``network.services``."""

from django.conf import settings
from django.contrib import messages
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from controlplane.portal.access import project_page
from controlplane.portal.forms import (
    AssociateForm,
    ConnectionForm,
    GlobalIpForm,
    NetworkForm,
    OutboundForm,
    PortCreateForm,
    PortForwardForm,
    PortSecurityForm,
    RuleForm,
    SecurityGroupForm,
    SubnetForm,
)
from controlplane.portal.views.common import act, page, submit
from network import services
from network.models import (
    ExternalConnection,
    FixedIp,
    GlobalIp,
    Network,
    Port,
    PortForward,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)
from tenants.choices import Role

# --- networks ---------------------------------------------------------------------------------


@project_page()
def networks(request, project):
    form = NetworkForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.network_create(project=project, **v))
        if ok:
            messages.success(
                request, _("Network %(name)s created.") % {"name": form.cleaned_data["name"]}
            )
            return redirect("portal:networks", slug=project.slug)
    subnets = {}
    for subnet in Subnet.objects.for_project(project).order_by("created_at"):
        subnets.setdefault(subnet.network_id, []).append(subnet)
    rows = list(Network.objects.for_project(project).order_by("name"))
    for network in rows:
        network.subnet_list = subnets.get(network.pk, [])
    return page(
        request,
        "portal/network/networks.html",
        {
            "networks": rows,
            "form": form,
            "subnets": [s for network in rows for s in network.subnet_list],
            "dns_domain": settings.DNS_DOMAIN,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page()
def subnet_dns(request, project, pk):
    """Set the DNS servers a subnet's guests are told (comma- or space-separated; empty:
    the network's own resolver)."""
    subnet = get_object_or_404(Subnet.objects.for_project(project), pk=pk)
    servers = request.POST.get("dns_servers", "").replace(",", " ").split()
    told = ", ".join(servers) or _("the network's own resolver")
    return act(
        request,
        services.subnet_update,
        done=_("Subnet %(cidr)s: guests are told %(told)s.") % {"cidr": subnet.cidr, "told": told},
        back=reverse("portal:networks", kwargs={"slug": project.slug}),
        subnet=subnet,
        dns_servers=servers,
    )


NETWORK_FORMS = ("subnet", "port", "outbound")


@project_page()
def network_detail(request, project, pk):
    """One network: its subnets (add one), its ports (add one of its own, delete one that
    belongs to no VM), outbound access (SNAT) and the DNS servers its guests are told."""
    network = get_object_or_404(Network.objects.for_project(project), pk=pk)
    which = request.POST.get("form") if request.method == "POST" else None
    data = {name: request.POST if which == name else None for name in NETWORK_FORMS}
    forms = {
        "subnet": SubnetForm(data["subnet"]),
        "port": PortCreateForm(data["port"], project=project),
        "outbound": OutboundForm(
            data["outbound"], initial={"external_access": network.external_access}
        ),
    }
    status = 200
    if which in forms:
        calls = {
            "subnet": lambda v: services.subnet_create(network=network, **v),
            "port": lambda v: services.port_create(network=network, **v),
            "outbound": lambda v: services.network_update(network=network, **v),
        }
        ok, status = submit(forms[which], calls[which])
        if ok:
            messages.success(
                request,
                {
                    "subnet": _("Subnet added."),
                    "port": _("Port created."),
                    "outbound": _("Outbound access saved."),
                }[which],
            )
            return redirect("portal:network-detail", slug=project.slug, pk=network.pk)
    elif request.method == "POST":
        status = 400
        messages.error(request, _("form: say which form this is (subnet, port or outbound)."))
    ports = (
        Port.objects.for_project(project)
        .filter(network=network)
        .select_related("vm", "global_ip")
        .prefetch_related(
            Prefetch("fixed_ips", queryset=FixedIp.objects.order_by("address")),
            Prefetch("security_groups", queryset=SecurityGroup.objects.order_by("name")),
        )
        .order_by("created_at")
    )
    return page(
        request,
        "portal/network/detail.html",
        {
            "network": network,
            "subnets": Subnet.objects.for_project(project)
            .filter(network=network)
            .order_by("created_at"),
            "ports": ports,
            "connections": ExternalConnection.objects.for_project(project)
            .filter(network=network)
            .order_by("name"),
            "dns_domain": settings.DNS_DOMAIN,
            **forms,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page()
def subnet_delete(request, project, pk):
    """Remove a subnet none of whose addresses is in use (409 otherwise)."""
    subnet = get_object_or_404(Subnet.objects.for_project(project), pk=pk)
    return act(
        request,
        services.subnet_delete,
        done=_("Subnet %(cidr)s removed.") % {"cidr": subnet.cidr},
        back=reverse(
            "portal:network-detail", kwargs={"slug": project.slug, "pk": subnet.network_id}
        ),
        subnet=subnet,
    )


@project_page()
def port_security_groups(request, project, pk):
    """A port's security groups and port security (a VM's NIC or a port of its own), changed
    through ``services.port_update``; back to the port's VM, or to its network."""
    port = get_object_or_404(
        Port.objects.for_project(project).select_related("network", "vm"), pk=pk
    )
    groups = list(port.security_groups.order_by("name"))  # shown, and the form's ticks
    current = {"security_groups": groups, "port_security": port.port_security}
    form = PortSecurityForm(request.POST or None, project=project, initial=current)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.port_update(port=port, **v))
        if ok:
            messages.success(
                request, _("Security groups of port %(port)s saved.") % {"port": _port_name(port)}
            )
            if port.vm is not None:
                return redirect("portal:vm-detail", slug=project.slug, pk=port.vm.pk)
            return redirect("portal:network-detail", slug=project.slug, pk=port.network_id)
    return page(
        request,
        "portal/network/port.html",
        {"port": port, "port_name": _port_name(port), "groups": groups, "form": form},
        project=project,
        status=status,
    )


def _port_name(port: Port) -> str:
    """A port as people know it: its name, or its VM's NIC, or its id."""
    if port.name:
        return port.name
    if port.vm is not None:
        return f"{port.vm.name} NIC {port.device_index}"
    return str(port.pk)


@require_POST
@project_page()
def port_delete(request, project, pk):
    port = get_object_or_404(Port.objects.for_project(project), pk=pk)
    return act(
        request,
        services.port_delete,
        done=_("Port %(port)s deleted.") % {"port": port.name or port.pk},
        back=reverse("portal:network-detail", kwargs={"slug": project.slug, "pk": port.network_id}),
        port=port,
    )


@require_POST
@project_page()
def network_delete(request, project, pk):
    network = get_object_or_404(Network.objects.for_project(project), pk=pk)
    return act(
        request,
        services.network_delete,
        done=_("Network %(name)s deleted.") % {"name": network.name},
        back=reverse("portal:networks", kwargs={"slug": project.slug}),
        network=network,
    )


# --- security groups --------------------------------------------------------------------------


@project_page()
def security_groups(request, project):
    form = SecurityGroupForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.security_group_create(project=project, **v))
        if ok:
            messages.success(
                request, _("Security group %(name)s created.") % {"name": form.cleaned_data["name"]}
            )
            return redirect("portal:security-groups", slug=project.slug)
    groups = SecurityGroup.objects.for_project(project).prefetch_related("rules").order_by("name")
    return page(
        request,
        "portal/network/security_groups.html",
        {"groups": groups, "form": form},
        project=project,
        status=status,
    )


def _group(project, pk) -> SecurityGroup:
    return get_object_or_404(SecurityGroup.objects.for_project(project), pk=pk)


@project_page()
def security_group_detail(request, project, pk):
    """A group's rules; members add a rule (open a port) and remove rules."""
    group = _group(project, pk)
    form = RuleForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.rule_create(group=group, **v))
        if ok:
            messages.success(request, _("Rule added to %(name)s.") % {"name": group.name})
            return redirect("portal:security-group", slug=project.slug, pk=group.pk)
    rules = (
        SecurityGroupRule.objects.for_project(project)
        .filter(group=group)
        .select_related("remote_group")
        .order_by("created_at")
    )
    return page(
        request,
        "portal/network/security_group.html",
        {"group": group, "rules": rules, "form": form},
        project=project,
        status=status,
    )


@require_POST
@project_page()
def security_group_delete(request, project, pk):
    group = _group(project, pk)
    return act(
        request,
        services.security_group_delete,
        done=_("Security group %(name)s deleted.") % {"name": group.name},
        back=reverse("portal:security-groups", kwargs={"slug": project.slug}),
        group=group,
    )


@require_POST
@project_page()
def rule_delete(request, project, pk):
    rule = get_object_or_404(SecurityGroupRule.objects.for_project(project), pk=pk)
    return act(
        request,
        services.rule_delete,
        done=_("Rule %(rule)s removed.") % {"rule": rule},
        back=reverse("portal:security-group", kwargs={"slug": project.slug, "pk": rule.group_id}),
        rule=rule,
    )


# --- global IPs and port forwards -------------------------------------------------------------


@project_page()
def global_ips(request, project):
    """The project's global addresses: 1:1 NAT to a VM (associate, disassociate) and port
    forwards (DNAT)."""
    which = request.POST.get("form")
    allocate = GlobalIpForm(request.POST if which == "allocate" else None)
    forward = PortForwardForm(request.POST if which == "forward" else None, project=project)
    associate = AssociateForm(request.POST if which == "associate" else None, project=project)
    status = 200
    if request.method == "POST":
        if which == "allocate":
            ok, status = submit(
                allocate, lambda v: services.global_ip_allocate(project=project, **v)
            )
        elif which == "associate":
            ok, status = submit(
                associate,
                lambda v: services.global_ip_associate(address=v["global_ip"], port=v["port"]),
            )
        else:
            ok, status = submit(
                forward,
                lambda v: services.port_forward_create(address=v.pop("global_ip"), **v),
            )
        if ok:
            messages.success(request, _("Done."))
            return redirect("portal:global-ips", slug=project.slug)
    return page(
        request,
        "portal/network/global_ips.html",
        {
            "addresses": GlobalIp.objects.for_project(project)
            .select_related("port__vm")
            .order_by("address"),
            "forwards": PortForward.objects.for_project(project)
            .select_related("global_ip", "port__vm")
            .order_by("global_ip__address", "external_port"),
            "allocate": allocate,
            "forward": forward,
            "associate": associate,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page()
def global_ip_release(request, project, pk):
    address = get_object_or_404(GlobalIp.objects.for_project(project), pk=pk)
    return act(
        request,
        services.global_ip_release,
        done=_("%(address)s released.") % {"address": address.address},
        back=reverse("portal:global-ips", kwargs={"slug": project.slug}),
        address=address,
    )


@require_POST
@project_page()
def global_ip_disassociate(request, project, pk):
    """End an address's 1:1 NAT; the address stays the project's."""
    address = get_object_or_404(GlobalIp.objects.for_project(project), pk=pk)
    return act(
        request,
        services.global_ip_associate,
        done=_("%(address)s no longer maps to a VM.") % {"address": address.address},
        back=reverse("portal:global-ips", kwargs={"slug": project.slug}),
        address=address,
        port=None,
    )


@require_POST
@project_page()
def port_forward_delete(request, project, pk):
    forward = get_object_or_404(PortForward.objects.for_project(project), pk=pk)
    return act(
        request,
        services.port_forward_delete,
        done=_("Port forward removed."),
        back=reverse("portal:global-ips", kwargs={"slug": project.slug}),
        forward=forward,
    )


# --- external connections ---------------------------------------------------------------------


@project_page(write_role=Role.ADMIN)
def connections(request, project):
    """Links to outside networks: admins request one (as in the API), everyone sees its
    state; operators approve or reject them (``/fleet/connections/``)."""
    form = ConnectionForm(request.POST or None, project=project)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.connection_request(project=project, **v))
        if ok:
            messages.success(
                request,
                _("Connection %(name)s requested; an operator reviews it.")
                % {"name": form.cleaned_data["name"]},
            )
            return redirect("portal:connections", slug=project.slug)
    return page(
        request,
        "portal/network/connections.html",
        {
            "connections": ExternalConnection.objects.for_project(project)
            .select_related("network")
            .order_by("name"),
            "form": form,
        },
        project=project,
        status=status,
    )


@require_POST
@project_page(write_role=Role.ADMIN)
def connection_delete(request, project, pk):
    connection = get_object_or_404(ExternalConnection.objects.for_project(project), pk=pk)
    return act(
        request,
        services.connection_delete,
        done=_("Connection %(name)s deleted.") % {"name": connection.name},
        back=reverse("portal:connections", kwargs={"slug": project.slug}),
        connection=connection,
    )
