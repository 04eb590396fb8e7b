"""Networks (created with a subnet's CIDR), security groups and their rules, global IPs and
DNAT port forwards; every write through ``network.services``."""

from django.conf import settings
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from controlplane.portal.access import project_page
from controlplane.portal.forms import (
    GlobalIpForm,
    NetworkForm,
    PortForwardForm,
    RuleForm,
    SecurityGroupForm,
)
from controlplane.portal.views.common import act, page, submit
from network import services
from network.models import (
    GlobalIp,
    Network,
    PortForward,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)

# --- networks ---------------------------------------------------------------------------------


@project_page()
def networks(request, project):
    form = NetworkForm(request.POST or None)
    status = 200
    if request.method == "POST":
        ok, status = submit(form, lambda v: services.network_create(project=project, **v))
        if ok:
            messages.success(request, f"Network {form.cleaned_data['name']} created.")
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
    told = ", ".join(servers) or "the network's own resolver"
    return act(
        request,
        services.subnet_update,
        done=f"Subnet {subnet.cidr}: guests are told {told}.",
        back=reverse("portal:networks", kwargs={"slug": project.slug}),
        subnet=subnet,
        dns_servers=servers,
    )


@require_POST
@project_page()
def network_delete(request, project, pk):
    network = get_object_or_404(Network.objects.for_project(project), pk=pk)
    return act(
        request,
        services.network_delete,
        done=f"Network {network.name} deleted.",
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
            messages.success(request, f"Security group {form.cleaned_data['name']} created.")
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
            messages.success(request, f"Rule added to {group.name}.")
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
        done=f"Security group {group.name} deleted.",
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
        done=f"Rule {rule} removed.",
        back=reverse("portal:security-group", kwargs={"slug": project.slug, "pk": rule.group_id}),
        rule=rule,
    )


# --- global IPs and port forwards -------------------------------------------------------------


@project_page()
def global_ips(request, project):
    """The project's global addresses and their port forwards (DNAT)."""
    allocate = GlobalIpForm(request.POST if request.POST.get("form") == "allocate" else None)
    forward = PortForwardForm(
        request.POST if request.POST.get("form") == "forward" else None, project=project
    )
    status = 200
    if request.method == "POST":
        if request.POST.get("form") == "allocate":
            ok, status = submit(
                allocate, lambda v: services.global_ip_allocate(project=project, **v)
            )
        else:
            ok, status = submit(
                forward,
                lambda v: services.port_forward_create(address=v.pop("global_ip"), **v),
            )
        if ok:
            messages.success(request, "Done.")
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
        done=f"{address.address} released.",
        back=reverse("portal:global-ips", kwargs={"slug": project.slug}),
        address=address,
    )


@require_POST
@project_page()
def port_forward_delete(request, project, pk):
    forward = get_object_or_404(PortForward.objects.for_project(project), pk=pk)
    return act(
        request,
        services.port_forward_delete,
        done="Port forward removed.",
        back=reverse("portal:global-ips", kwargs={"slug": project.slug}),
        forward=forward,
    )
