"""VMs: the list (its rows poll for live state), launching from a template, a VM's detail
(state, spot notice, how to reach it, GPUs and their NUMA cells, NCCL topology, events)
and its actions. The detail page polls ``vm_state``, whose answer carries the state panel
and, out of band, the action buttons and the page's note, so nothing on it goes stale."""

from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, pgettext_lazy
from django.views.decorators.http import require_POST

from compute import services
from compute.choices import Priority, VmState
from compute.models import Template, VirtualMachine
from compute.services import lifecycle
from controlplane.errors import KumoError
from controlplane.models import AuditEvent, Event
from controlplane.portal import reports
from controlplane.portal.access import form_error, project_page
from controlplane.portal.forms import VmCreateForm
from controlplane.portal.views.common import act, page
from network.choices import ForwardProtocol
from network.models import FixedIp, GlobalIp, Port, PortForward, SecurityGroup
from tenants import billing, selectors
from tenants.models import SSHKey

ACTIONS = {
    "start": services.vm_start,
    "stop": services.vm_stop,
    "reboot": services.vm_reboot,
    "reset": services.vm_reset,
    "power_off": services.vm_power_off,
    "shelve": services.vm_shelve,
    "unshelve": services.vm_unshelve,
    "delete": services.vm_delete,
}

# Each button's label ("VM action" tells Start and Stop apart from other starts and stops).
ACTION_LABEL = {
    "start": pgettext_lazy("VM action", "Start"),
    "stop": pgettext_lazy("VM action", "Stop"),
    "reboot": pgettext_lazy("VM action", "Reboot"),
    "reset": pgettext_lazy("VM action", "Reset"),
    "power_off": gettext_lazy("Power off"),
    "shelve": pgettext_lazy("VM action", "Shelve"),
    "unshelve": pgettext_lazy("VM action", "Unshelve"),
    "delete": pgettext_lazy("VM action", "Delete"),
}

# What cannot be undone asks first (``data-confirm``), naming the VM; its button is red.
ACTION_QUESTION = {
    "delete": gettext_lazy("Delete VM %(name)s? Its disk and everything on it go with it."),
    "power_off": gettext_lazy(
        "Power off VM %(name)s without shutting it down? Work it has not saved is lost."
    ),
    "reset": gettext_lazy("Reset VM %(name)s? It restarts at once; work it has not saved is lost."),
}

# What a button's success says (the English of each is "<Action> of VM <name> requested.").
ACTION_DONE = {
    "start": gettext_lazy("Start of VM %(name)s requested."),
    "stop": gettext_lazy("Stop of VM %(name)s requested."),
    "reboot": gettext_lazy("Reboot of VM %(name)s requested."),
    "reset": gettext_lazy("Reset of VM %(name)s requested."),
    "power_off": gettext_lazy("Power-off of VM %(name)s requested."),
    "shelve": gettext_lazy("Shelve of VM %(name)s requested."),
    "unshelve": gettext_lazy("Unshelve of VM %(name)s requested."),
    "delete": gettext_lazy("Delete of VM %(name)s requested."),
}


def allowed_actions(vm: VirtualMachine) -> set[str]:
    """The buttons to offer: what ``compute.services.lifecycle.ACTIONS`` allows in the VM's state
    (only delete while another action is in flight). The service decides again on POST."""
    allowed = lifecycle.ACTIONS.get(vm.state, set())
    if not vm.task_state:
        return allowed
    return {a for a in allowed if vm.task_state in lifecycle.OVERRULES.get(a, ())}


def _vms(project):
    return (
        VirtualMachine.objects.for_project(project)
        .exclude(state=VmState.DELETED)
        .select_related("template", "host")
        .order_by("name")
    )


def _addresses(vms) -> dict:
    """Each VM's IPv4 addresses, in NIC order (one query)."""
    found: dict = {}
    rows = (
        FixedIp.objects.filter(port__vm__in=list(vms))
        .order_by("port__device_index", "address")
        .values_list("port__vm_id", "address")
    )
    for vm_id, address in rows:
        found.setdefault(vm_id, []).append(address)
    return found


def _rows_context(project):
    vms = list(_vms(project))
    addresses = _addresses(vms)
    for vm in vms:
        vm.addresses = addresses.get(vm.pk, [])
    return {"vms": vms}


@project_page()
def vm_list(request, project):
    return page(request, "portal/vms/list.html", _rows_context(project), project=project)


@project_page()
def vm_rows(request, project):
    """The list's rows alone: what the list page polls every few seconds."""
    return page(request, "portal/vms/_rows.html", _rows_context(project), project=project)


def _offers(project, now):
    """Each template on offer with its price per hour (on demand and spot, when a rate card
    prices it) and whether the project's quota has room for one more."""
    left = {name: row["available"] for name, row in selectors.quota_report(project).items()}
    card = billing.rate_card_at(now)
    offers = []
    for template in Template.objects.filter(active=True):
        offers.append(
            {
                "template": template,
                "on_demand": reports.price_per_hour(template, Priority.ON_DEMAND, card),
                "spot": reports.price_per_hour(template, Priority.SPOT, card)
                if template.spot_allowed
                else None,
                "fits": left["vms"] >= 1
                and left["vcpus"] >= template.vcpus
                and left["memory_gib"] >= template.memory_gib
                and left["gpus"] >= template.gpus,
            }
        )
    return offers, left


@project_page()
def vm_create(request, project):
    """Launch a VM from a template, optionally in a placement group or a lease of the
    project: the form lists each template's price per hour and the quota left;
    ``compute.services.vm_create`` decides."""
    form = VmCreateForm(request.POST or None, project=project, user=request.user)
    status = 200
    if request.method == "POST" and form.is_valid():
        v = form.cleaned_data
        try:
            vm, _operation = services.vm_create(
                project=project,
                name=v["name"],
                template=v["template"],
                image=v["image"],
                ssh_keys=[key.public_key for key in v["ssh_keys"]],
                user_data=v["user_data"],
                priority=v["priority"],
                nics=[{"network": v["network"]}] if v["network"] else [],
                placement_group=v["placement_group"],
                lease=v["lease"],
                actor=request.user,
            )
        except KumoError as e:
            status = form_error(form, e)
        else:
            messages.success(
                request, _("VM %(name)s is %(state)s.") % {"name": vm.name, "state": vm.state}
            )
            return redirect("portal:vm-detail", slug=project.slug, pk=vm.pk)
    elif request.method == "POST":
        status = 400
    offers, left = _offers(project, timezone.now())
    return page(
        request,
        "portal/vms/new.html",
        {
            "form": form,
            "offers": offers,
            "left": left,
            "has_ssh_keys": SSHKey.objects.filter(user=request.user).exists(),
        },
        project=project,
        status=status,
    )


def _vm(project, pk) -> VirtualMachine:
    return get_object_or_404(
        VirtualMachine.objects.for_project(project).select_related(
            "template", "image", "host", "placement_group", "lease"
        ),
        pk=pk,
    )


# Where ssh looks for a private key of each type when none is named.
DEFAULT_KEY_FILES = {
    "ssh-ed25519": "id_ed25519",
    "ssh-rsa": "id_rsa",
    "ecdsa-sha2-nistp256": "id_ecdsa",
    "ecdsa-sha2-nistp384": "id_ecdsa",
    "ecdsa-sha2-nistp521": "id_ecdsa",
}


def _key_body(public_key: str) -> str:
    """A public key's type and base64 blob, without its comment: what identifies it."""
    return " ".join(public_key.split()[:2])


def _key_names(vm: VirtualMachine, user) -> list[str]:
    """The file names under ``~/.ssh/`` of the keys ``vm`` was given: the caller's own
    SSH key of the same public key by its name, else ssh's default file for the key's
    type (a comment such as ``ai@lab`` names no file)."""
    mine = {_key_body(k.public_key): k.name for k in SSHKey.objects.filter(user=user)}
    names = []
    for public_key in vm.ssh_keys or []:
        kind = public_key.split()[0] if public_key.split() else ""
        name = mine.get(_key_body(public_key)) or DEFAULT_KEY_FILES.get(kind, "id_ed25519")
        if name not in names:
            names.append(name)
    return names


def connect_info(project, vm: VirtualMachine, ports, user) -> dict:
    """How to reach ``vm``: its image's login user, its addresses, the global IP (1:1
    NAT) and the port forwards that reach it, and the ssh command for the best of them
    (a global IP, else a forward of TCP port 22, else its first fixed address, reached
    from inside the project's networks only). Network rows are read through the
    project's querysets."""
    addresses = [ip.address for port in ports for ip in port.fixed_ips.all()]
    global_ips = list(GlobalIp.objects.for_project(project).filter(port__vm=vm).order_by("address"))
    forwards = list(
        PortForward.objects.for_project(project)
        .filter(port__vm=vm)
        .select_related("global_ip")
        .order_by("global_ip__address", "external_port")
    )
    login_user = vm.image.login_user
    keys = _key_names(vm, user)
    target, port, public = (addresses[0] if addresses else ""), None, False
    ssh_forward = next(
        (f for f in forwards if f.protocol == ForwardProtocol.TCP and f.internal_port == 22), None
    )
    if global_ips:
        target, public = global_ips[0].address, True
    elif ssh_forward is not None:
        target, port, public = ssh_forward.global_ip.address, ssh_forward.external_port, True
    command = ""
    if target:
        identity = f"-i ~/.ssh/{keys[0]} " if keys else ""
        via = f"-p {port} " if port else ""
        command = f"ssh {identity}{via}{login_user or '<user>'}@{target}"
    return {
        "login_user": login_user,
        "addresses": addresses,
        "global_ips": global_ips,
        "forwards": forwards,
        "keys": keys,
        "command": command,
        "public": public,
    }


def vm_note(vm: VirtualMachine) -> str:
    """The page's note once the VM moves on from the action that was asked: where it is."""
    doing = f" ({vm.task_state.replace('_', ' ')}…)" if vm.task_state else ""
    return f"VM {vm.name} is {vm.state}{doing}."


@dataclass(frozen=True)
class Button:
    action: str
    label: str
    question: str  # "" for an action that can be undone


def _buttons(vm: VirtualMachine) -> list[Button]:
    """The VM's action buttons, in ``ACTIONS``' order, for the actions its state allows."""
    allowed = allowed_actions(vm)
    return [
        Button(a, str(ACTION_LABEL[a]), str(ACTION_QUESTION.get(a, "")) % {"name": vm.name})
        for a in ACTIONS
        if a in allowed
    ]


@project_page()
def vm_detail(request, project, pk):
    vm = _vm(project, pk)
    devices = reports.vm_gpus(vm)
    ports = list(
        Port.objects.filter(vm=vm)
        .select_related("network")
        .prefetch_related(
            "fixed_ips",
            Prefetch("security_groups", queryset=SecurityGroup.objects.order_by("name")),
        )
        .order_by("device_index")
    )
    inside = reports.guest_pci_addresses(vm, devices)
    for device in devices:
        device.guest_pci_address = inside.get(device.pk, "")
    key = {"object_id": str(vm.pk)}
    # This page shows the action's message itself (``#vm-flash``), where the state poll
    # keeps a success note current; the layout's list gets none.
    flash = list(messages.get_messages(request))
    return page(
        request,
        "portal/vms/detail.html",
        {
            "vm": vm,
            "buttons": _buttons(vm),
            "flash": flash,
            "messages": [],
            "connect": connect_info(project, vm, ports, request.user),
            "devices": devices,
            "topology": reports.nccl_topology(vm, devices),
            "ports": ports,
            "events": Event.objects.for_project(project).filter(**key).order_by("-created_at")[:20],
            "audit": AuditEvent.objects.for_project(project).filter(**key)[:20],
        },
        project=project,
    )


@project_page()
def vm_console_log(request, project, pk):
    """The last 64 KiB of the guest's serial console, asked of its host (waits a few
    seconds at most; then says the host has not answered yet)."""
    from compute.api.views import wait_for_operation
    from controlplane.errors import Conflict
    from tenants.choices import Role

    vm = _vm(project, pk)
    output, problem = "", ""
    if not Role.at_least(request.membership.role, Role.MEMBER):
        problem = _("Only members of the project may read a VM's console.")
    else:
        try:
            operation = services.vm_console_log(vm=vm, max_bytes=65536, actor=request.user)
        except Conflict as e:
            problem = e.message
        else:
            done = wait_for_operation(operation, settings.CONSOLE_LOG_WAIT_S)
            if done is None:
                problem = _("The VM's host has not answered yet; reload in a moment.")
            elif done.state != "succeeded":
                problem = _("The VM's host could not read the console: %(error_message)s") % {
                    "error_message": done.error_message
                }
            else:
                output = done.result.get("output", "")
    return page(
        request,
        "portal/vms/console_log.html",
        {"vm": vm, "output": output, "problem": problem},
        project=project,
    )


@project_page()
def vm_console(request, project, pk):
    """The guest's interactive serial console: a terminal (xterm.js) that asks
    ``vm_console_token`` for a token and opens the console proxy's websocket with it."""
    from tenants.choices import Role

    vm = _vm(project, pk)
    problem = ""
    if not Role.at_least(request.membership.role, Role.MEMBER):
        problem = _("Only members of the project may open a VM's console.")
    elif vm.state != VmState.RUNNING:
        problem = _("%(name)s is %(state)s: only a running VM has a console to open.") % {
            "name": vm.name,
            "state": vm.state,
        }
    return page(request, "portal/vms/console.html", {"vm": vm, "problem": problem}, project=project)


@require_POST
@project_page()
def vm_console_token(request, project, pk):
    """A console token for the caller (JSON, as the API's ``console`` action answers), or
    the reason there is none (``{"message": ...}`` with 409)."""
    from django.http import JsonResponse

    from controlplane.errors import Conflict

    try:
        ticket = services.console_token_issue(vm=_vm(project, pk), user=request.user)
    except Conflict as e:
        return JsonResponse({"message": e.message}, status=409)
    return JsonResponse(
        {"url": ticket.url, "token": ticket.token, "expires_at": ticket.expires_at.isoformat()}
    )


@project_page()
def vm_state(request, project, pk):
    """What the detail page polls: its state panel (state, task, power, reason, spot
    notice) and, swapped out of band, the action buttons the state allows now and the
    note that replaces a success message once the VM has moved on."""
    vm = _vm(project, pk)
    return page(
        request,
        "portal/vms/state.html",
        {"vm": vm, "buttons": _buttons(vm), "note": vm_note(vm)},
        project=project,
    )


@require_POST
@project_page()
def vm_action(request, project, pk, action):
    """Start, stop, reboot, reset, power off, shelve, unshelve or delete through the
    service; a state that forbids the action is a message naming the state."""
    vm = _vm(project, pk)
    back = reverse("portal:vm-detail", kwargs={"slug": project.slug, "pk": vm.pk})
    if action == "delete":
        back = reverse("portal:vms", kwargs={"slug": project.slug})
    return act(
        request,
        ACTIONS[action],
        done=ACTION_DONE[action] % {"name": vm.name},
        back=back,
        vm=vm,
        actor=request.user,
    )
