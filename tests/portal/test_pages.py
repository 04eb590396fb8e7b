"""The portal through Django's test client: every page answers its members, outsiders get
404, readers cannot write (403, audited), bad input becomes a form error naming the field
(never a 500), and what the pages do is what the services did."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from compute.choices import HostState, Priority, VmState
from compute.models import VirtualMachine
from compute.services import spot
from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from controlplane.portal import reports
from network.models import GlobalIp, Network, PortForward, SecurityGroup, SecurityGroupRule
from storage.models import Volume
from tenants import billing, invitations
from tenants import services as tenants
from tenants.choices import Role
from tenants.models import ApiToken, Budget, Invitation, Membership
from tests.factories import (
    UserFactory,
    add_member,
    make_network,
    make_pool,
    make_project,
    make_vm,
)

pytestmark = pytest.mark.django_db

PROJECT_PAGES = [
    "dashboard",
    "vms",
    "vm-rows",
    "vm-create",
    "networks",
    "security-groups",
    "global-ips",
    "images",
    "storage",
    "placement-groups",
    "leases",
    "reclamation",
    "members",
    "billing",
    "audit",
    "events",
    "connections",
    "webhooks",
    "project-settings",
]


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def errors_of(response, field):
    """The error messages the page shows under ``field``."""
    html = response.content.decode()
    found = re.search(rf'<ul class="errorlist" role="alert" data-field="{field}">(.*?)</ul>', html)
    return found.group(1) if found else ""


# --- who sees what ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROJECT_PAGES)
@pytest.mark.parametrize("role", [Role.READER, Role.OWNER])
def test_every_project_page_answers_its_members(login, project, cloud, rate_card, name, role):
    make_vm(project, template=cloud["gpu"], image=cloud["image"], name="train-1")
    response = login(cloud["users"][role]).get(url(name, project))
    assert response.status_code == 200
    assert project.slug in response.content.decode()


@pytest.mark.parametrize("name", PROJECT_PAGES)
def test_an_outsider_gets_404_like_a_missing_project(login, project, name):
    outsider = UserFactory()
    make_project(owner=outsider)
    response = login(outsider).get(url(name, project))
    assert response.status_code == 404
    assert project.name not in response.content.decode()
    missing = reverse(f"portal:{name}", kwargs={"slug": "no-such-project"})
    assert login(outsider).get(missing).status_code == 404


def test_another_projects_object_is_404(login, project, cloud):
    other = make_project()
    theirs = make_vm(other, template=cloud["cpu"], image=cloud["image"])
    member = login(cloud["users"][Role.MEMBER])
    assert member.get(url("vm-detail", project, pk=theirs.pk)).status_code == 404
    response = member.post(url("vm-action", project, pk=theirs.pk, action="stop"))
    assert response.status_code == 404


def test_anonymous_is_sent_to_log_in(client, project):
    response = client.get(url("dashboard", project))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("portal:login"))


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("networks", {"name": "lab", "cidr": "10.0.0.0/24"}),
        ("vm-create", {"name": "x"}),
        ("storage", {"form": "volume", "name": "scratch", "size_gib": "10", "tier": "shared"}),
        ("security-groups", {"name": "web"}),
        ("global-ips", {"form": "allocate"}),
    ],
)
def test_a_reader_cannot_write_and_the_refusal_is_audited(login, project, cloud, name, data):
    reader = cloud["users"][Role.READER]
    response = login(reader).post(url(name, project), data)
    assert response.status_code == 403
    assert "your role in project" in response.content.decode().lower()
    assert not Network.objects.for_project(project).exists()
    denied = AuditEvent.objects.for_project(project).get(outcome=AuditOutcome.DENIED)
    assert denied.actor == reader
    assert denied.source == "portal"


def test_a_reader_is_offered_no_write_forms(login, project, cloud):
    make_network(project, name="lab")
    page = login(cloud["users"][Role.READER]).get(url("networks", project)).content.decode()
    assert "lab" in page
    assert "New network" not in page
    assert "Delete" not in page


def test_members_are_managed_by_admins_only(login, project, cloud):
    member = cloud["users"][Role.MEMBER]
    response = login(member).post(url("members", project), {"email": "new@uni.example.ac.jp"})
    assert response.status_code == 403
    assert not Invitation.objects.exists()


def test_csrf_is_enforced(login, project, cloud):
    client = login(cloud["users"][Role.OWNER], csrf=True)
    response = client.post(url("networks", project), {"name": "lab"})
    assert response.status_code == 403
    assert not Network.objects.for_project(project).exists()
    page = client.get(url("networks", project)).content.decode()
    assert 'name="csrfmiddlewaretoken"' in page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(url("networks", project), {"name": "lab", "csrfmiddlewaretoken": token})
    assert response.status_code == 302


def test_the_switcher_leads_to_the_chosen_project(login, project, cloud):
    owner = cloud["users"][Role.OWNER]
    second = make_project(owner=owner)
    client = login(owner)
    home = client.get(reverse("portal:home")).content.decode()
    assert f'value="{second.slug}"' in home and f'value="{project.slug}"' in home
    response = client.get(reverse("portal:switch"), {"project": second.slug})
    assert response["Location"] == url("dashboard", second)


# --- dashboard ---------------------------------------------------------------------------------


def test_the_dashboard_shows_quota_vms_gpu_hours_and_spend(login, project, cloud, rate_card):
    vm = make_vm(project, template=cloud["gpu"], image=cloud["image"])
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    page = login(cloud["users"][Role.READER]).get(url("dashboard", project)).content.decode()
    assert re.search(r'id="running-vms">1<', page)
    assert re.search(r"gpus</td><td class=\"num\">1 / 16", page)
    assert "<svg" in page and "GPU-hours per day" in page
    assert re.search(r'id="spend">[\d,]+\.\d\d JPY', page)  # a few seconds of a GPU VM
    assert re.search(r"projected [\d,]+\.\d\d JPY", page)  # thousands separated


def test_usage_by_day_clips_intervals_to_days(project, cloud, rate_card):
    vm = make_vm(project, template=cloud["gpu"], image=cloud["image"])  # provisioning: billed
    now = vm.created_at + timedelta(hours=2)
    days = reports.usage_by_day(project, "gpu", now)
    # The days of ``now``'s month: two hours, less what fell in the month before (a VM made
    # in the last two hours of a month).
    counted = now - max(vm.created_at, days[0][0])
    expected = Decimal(counted.total_seconds()) / 3600
    assert sum(v for _, v in days) == pytest.approx(expected, abs=Decimal("0.01"))


# --- VMs ---------------------------------------------------------------------------------------


def test_the_launch_form_shows_prices_from_the_rate_card_and_the_quota_left(
    login, project, cloud, rate_card
):
    page = login(cloud["users"][Role.MEMBER]).get(url("vm-create", project)).content.decode()
    gpu = cloud["gpu"]  # 16 vCPUs x 10 + 57 GiB x 1.5 + 1 A100 x 500 = 745.50 an hour
    row = re.search(rf'data-template="{gpu.name}">(.*?)</tr>', page, re.S).group(1)
    assert "745.50 JPY" in row
    assert "223.65 JPY" in row  # spot: x 0.3
    price = reports.price_per_hour(gpu, Priority.ON_DEMAND, rate_card)
    assert price.per_hour == Decimal("745.50")
    assert re.search(r"<td>gpus</td><td class=\"num\">16</td>", page)


def test_without_a_rate_card_no_price_is_shown(login, project, cloud):
    page = login(cloud["users"][Role.MEMBER]).get(url("vm-create", project)).content.decode()
    assert "No rate card prices these templates yet" in page


def test_launching_a_vm_calls_the_service_and_shows_it(login, project, cloud):
    make_network(project, name="lab")
    network = Network.objects.for_project(project).get(name="lab")
    client = login(cloud["users"][Role.MEMBER])
    response = client.post(
        url("vm-create", project),
        {
            "name": "train-1",
            "template": cloud["gpu"].name,
            "image": cloud["image"].pk,
            "priority": "on_demand",
            "network": network.pk,
        },
    )
    vm = VirtualMachine.objects.for_project(project).get(name="train-1")
    assert response.status_code == 302
    assert response["Location"] == url("vm-detail", project, pk=vm.pk)
    assert vm.state == VmState.PROVISIONING and vm.host == cloud["host"]
    assert vm.ports.count() == 1
    rows = client.get(url("vm-rows", project)).content.decode()
    assert 'data-vm="train-1"' in rows and 'data-state="provisioning"' in rows
    assert "192.168.10." in rows


@pytest.mark.parametrize(
    ("data", "field", "status", "says"),
    [
        ({"name": "Bad_Name"}, "name", 400, "hyphens"),
        ({"name": "ok", "template": "no-such"}, "template", 400, "valid choice"),
        ({"name": "ok", "priority": "cheap"}, "priority", 400, "valid choice"),
    ],
)
def test_bad_launch_input_names_the_field(login, project, cloud, data, field, status, says):
    form = {"template": cloud["cpu"].name, "image": cloud["image"].pk, "priority": "on_demand"}
    response = login(cloud["users"][Role.MEMBER]).post(url("vm-create", project), form | data)
    assert response.status_code == status
    assert says in errors_of(response, field)
    assert not VirtualMachine.objects.for_project(project).exists()


def test_a_service_refusal_lands_on_the_form(login, project, cloud):
    make_vm(project, template=cloud["cpu"], image=cloud["image"], name="taken")
    form = {"template": cloud["cpu"].name, "image": cloud["image"].pk, "priority": "on_demand"}
    client = login(cloud["users"][Role.MEMBER])
    response = client.post(url("vm-create", project), form | {"name": "taken"})
    assert response.status_code == 409
    assert "a VM named taken exists" in errors_of(response, "name")
    tenants.quota_set(project=project, gpus=0)
    response = client.post(
        url("vm-create", project), form | {"name": "big", "template": cloud["gpu"].name}
    )
    assert response.status_code == 409
    assert "gpus" in response.content.decode()
    assert not VirtualMachine.objects.for_project(project).filter(name="big").exists()


def test_vm_actions_go_through_the_service_and_refusals_are_messages(login, project, cloud):
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"])
    client = login(cloud["users"][Role.MEMBER])
    response = client.post(url("vm-action", project, pk=vm.pk, action="stop"), follow=True)
    assert response.status_code == 200
    assert f"vm {vm.name} is provisioning; cannot stop it" in response.content.decode()
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    response = client.post(url("vm-action", project, pk=vm.pk, action="stop"), follow=True)
    assert f"Stop of VM {vm.name} requested" in response.content.decode()
    vm.refresh_from_db()
    assert vm.task_state == "stopping"
    assert client.get(url("vm-action", project, pk=vm.pk, action="stop")).status_code == 405


def test_the_vm_page_shows_gpus_numa_cells_nccl_topology_and_the_trail(login, project, cloud):
    vm = make_vm(project, template=cloud["gpu"], image=cloud["image"])
    page = login(cloud["users"][Role.READER]).get(url("vm-detail", project, pk=vm.pk))
    html = page.content.decode()
    device = vm.devices.get()
    assert f"<code>{device.pci_address}</code>" in html
    assert f"<td>{device.numa_node}</td>" in html
    assert "&lt;system" in html and "numaid" in html  # the NCCL topology, escaped
    assert "vm.create" in html
    assert 'hx-trigger="every 3s"' in html
    assert "Delete" not in html  # a reader gets no buttons


def test_a_spot_notice_counts_down(login, project, cloud):
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], priority=Priority.SPOT)
    deadline = timezone.now() + timedelta(seconds=30)
    VirtualMachine.objects.filter(pk=vm.pk).update(
        state=VmState.EVICTING, eviction_deadline=deadline
    )
    client = login(cloud["users"][Role.READER])
    state = client.get(url("vm-state", project, pk=vm.pk)).content.decode()
    assert "Spot eviction notice" in state
    assert f'data-deadline="{deadline:%Y-%m-%dT%H:%M:%S}' in state
    assert "data-deadline" in client.get(url("vm-rows", project)).content.decode()


def test_a_running_spot_vm_shows_its_last_reported_checkpoint(login, project, cloud):
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], priority=Priority.SPOT)
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    client = login(cloud["users"][Role.READER])
    state = client.get(url("vm-state", project, pk=vm.pk)).content.decode()
    assert "No checkpoint reported by the guest" in state
    started = timezone.now() - timedelta(seconds=600)
    VirtualMachine.objects.filter(pk=vm.pk).update(created_at=started, running_since=started)
    spot.checkpoint_report(vm=vm)
    saved = VirtualMachine.objects.get(pk=vm.pk).checkpointed_at
    state = client.get(url("vm-state", project, pk=vm.pk)).content.decode()
    assert f"Last checkpoint reported by the guest: {saved:%Y-%m-%d %H:%M}." in state
    assert "It came 600 s after the one before (or the start)" in state


# --- networks ----------------------------------------------------------------------------------


def test_a_network_is_created_with_its_cidr(login, project, cloud):
    client = login(cloud["users"][Role.MEMBER])
    response = client.post(url("networks", project), {"name": "lab", "cidr": "10.1.0.0/24"})
    assert response.status_code == 302
    page = client.get(url("networks", project)).content.decode()
    assert "10.1.0.0/24" in page
    network = Network.objects.for_project(project).get(name="lab")
    assert network.subnets.get().cidr == "10.1.0.0/24"


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"name": "lab", "cidr": "10.1.0.0/33"}, "cidr", "cidr"),
        ({"name": "lab", "cidr": "not-a-cidr"}, "cidr", "cidr"),
        ({"name": "", "cidr": ""}, "name", "required"),
    ],
)
def test_bad_network_input_names_the_field(login, project, cloud, data, field, says):
    response = login(cloud["users"][Role.MEMBER]).post(url("networks", project), data)
    assert response.status_code == 400
    assert says in errors_of(response, field).lower()
    assert not Network.objects.for_project(project).exists()


def test_security_group_rules_are_added_and_removed(login, project, cloud):
    make_network(project, name="lab")  # brings the default group
    group = SecurityGroup.objects.for_project(project).get(name="default")
    client = login(cloud["users"][Role.MEMBER])
    rule = {"direction": "ingress", "protocol": "tcp", "port_min": "22", "remote_cidr": "0/0"}
    response = client.post(url("security-group", project, pk=group.pk), rule)
    assert response.status_code == 400
    assert "remote_cidr" in errors_of(response, "remote_cidr")
    rule["remote_cidr"] = "0.0.0.0/0"
    response = client.post(url("security-group", project, pk=group.pk), rule)
    assert response.status_code == 302
    added = SecurityGroupRule.objects.for_project(project).get(group=group, port_min=22)
    assert (added.port_max, added.remote_cidr) == (22, "0.0.0.0/0")
    response = client.post(
        url("security-group", project, pk=group.pk),
        {"direction": "ingress", "protocol": "icmp", "port_min": "22"},
    )
    assert "tcp and udp only" in errors_of(response, "port_min")
    client.post(url("rule-delete", project, pk=added.pk))
    assert not SecurityGroupRule.objects.filter(pk=added.pk).exists()


def test_an_address_is_allocated_and_a_port_forwarded_to_a_vm(login, project, cloud):
    make_pool()
    make_network(project, name="lab")
    network = Network.objects.for_project(project).get(name="lab")
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], nics=[{"network": network}])
    client = login(cloud["users"][Role.MEMBER])
    assert client.post(url("global-ips", project), {"form": "allocate"}).status_code == 302
    address = GlobalIp.objects.for_project(project).get(router=False)
    forward = {
        "form": "forward",
        "global_ip": address.pk,
        "protocol": "tcp",
        "external_port": "2222",
        "port": vm.ports.get().pk,
        "internal_port": "22",
    }
    assert client.post(url("global-ips", project), forward).status_code == 302
    page = client.get(url("global-ips", project)).content.decode()
    assert f"{address.address}:2222/tcp" in page and f"{vm.name}:22" in page
    response = client.post(url("global-ips", project), forward)
    assert response.status_code == 409
    top_errors = re.search(
        r'<ul class="errorlist" role="alert">(.*?)</ul>', response.content.decode()
    )
    assert f"{address.address}:2222/tcp is forwarded already" in top_errors.group(1)
    assert PortForward.objects.for_project(project).count() == 1


def test_volumes_are_made_within_quota(login, project, cloud):
    client = login(cloud["users"][Role.MEMBER])
    volume = {"form": "volume", "name": "scratch", "size_gib": "100", "tier": "shared"}
    assert client.post(url("storage", project), volume).status_code == 302
    assert Volume.objects.for_project(project).get().size_gib == 100
    response = client.post(url("storage", project), volume | {"name": "huge", "size_gib": "1e9"})
    assert response.status_code == 400
    assert errors_of(response, "size_gib")
    response = client.post(url("storage", project), volume | {"name": "huge", "size_gib": "5000"})
    assert response.status_code == 409
    assert "storage_gib" in response.content.decode()
    assert not Volume.objects.for_project(project).filter(name="huge").exists()


def test_port_forwards_need_a_pool_and_say_so(login, project, cloud):
    response = login(cloud["users"][Role.MEMBER]).post(
        url("global-ips", project), {"form": "allocate"}
    )
    assert response.status_code == 409
    assert "no global IP pool is configured" in response.content.decode()


# --- people ------------------------------------------------------------------------------------


def test_admins_change_and_remove_members(login, project, cloud):
    admin = login(cloud["users"][Role.ADMIN])
    newcomer = add_member(project)  # as accepting an invitation makes them
    membership = Membership.objects.for_project(project).get(user=newcomer)
    admin.post(url("member-role", project, username=newcomer.username), {"role": "reader"})
    membership.refresh_from_db()
    assert membership.role == Role.READER
    response = admin.post(
        url("member-role", project, username=project.owner.username),
        {"role": "member"},
        follow=True,
    )
    assert "only an owner can grant or change the owner role" in response.content.decode()
    admin.post(url("member-remove", project, username=newcomer.username))
    assert not Membership.objects.filter(pk=membership.pk).exists()


CSRF = re.compile(r'("X-CSRFToken": "|name="csrfmiddlewaretoken" value=")[^"]*')
EXPIRES = datetime(2030, 1, 1, tzinfo=UTC)


def test_inviting_answers_the_same_whether_or_not_the_address_has_an_account(login, project, cloud):
    known = UserFactory(email="known@uni.example.ac.jp")
    admin = login(cloud["users"][Role.ADMIN])
    answers, pages = {}, {}
    for email in (known.email, "nobody@uni.example.ac.jp"):
        answer = admin.post(url("members", project), {"email": email, "role": "reader"})
        invitation = Invitation.objects.for_project(project).get(email=email)
        # the page lists it with its expiry, which follows the second it was made
        Invitation.objects.filter(pk=invitation.pk).update(expires_at=EXPIRES)
        html = CSRF.sub(r"\1", admin.get(answer["Location"]).content.decode())
        answers[email] = (answer.status_code, answer["Location"], answer.content)
        pages[email] = html.replace(email, "X").replace(f"/{invitation.pk}/", "/N/")
        invitations.invitation_revoke(invitation=invitation)  # each page lists its own only
    assert answers[known.email] == answers["nobody@uni.example.ac.jp"]
    assert answers[known.email][:2] == (302, url("members", project))
    assert pages[known.email] == pages["nobody@uni.example.ac.jp"]
    assert "Invitation sent to X." in pages[known.email]
    assert f"{timezone.localtime(EXPIRES):%Y-%m-%d %H:%M}" in pages[known.email]
    assert not Membership.objects.filter(project=project, user=known).exists()


def test_a_bad_address_or_a_non_admin_invites_nobody(login, project, cloud):
    admin = login(cloud["users"][Role.ADMIN])
    response = admin.post(url("members", project), {"email": "bob", "role": "member"})
    assert response.status_code == 400
    assert errors_of(response, "email")
    response = admin.post(
        url("members", project), {"email": "b@uni.example.ac.jp", "role": "owner"}
    )
    assert response.status_code == 403  # only owners invite owners
    assert "only an owner" in response.content.decode()
    member = login(cloud["users"][Role.MEMBER])
    response = member.post(url("members", project), {"email": "b@uni.example.ac.jp"})
    assert response.status_code == 403
    assert not Invitation.objects.exists()


def test_admins_see_and_revoke_pending_invitations(login, project, cloud):
    invitation, _secret = invitations.invitation_create(
        project=project, email="ken@uni.example.ac.jp", role=Role.READER, actor=project.owner
    )
    revoke = url("invitation-revoke", project, pk=invitation.pk)
    reader = login(cloud["users"][Role.READER])
    page = reader.get(url("members", project)).content.decode()
    assert "ken@uni.example.ac.jp" not in page and revoke not in page  # admins only
    assert reader.post(revoke).status_code == 403
    admin = login(cloud["users"][Role.ADMIN])
    page = admin.get(url("members", project)).content.decode()
    row = re.search(r'<table id="invitations">.*?</table>', page, re.S).group(0)
    assert "ken@uni.example.ac.jp" in row and project.owner.username in row
    assert f"{timezone.localtime(invitation.expires_at):%Y-%m-%d %H:%M}" in row
    assert revoke in row
    done = admin.post(revoke, follow=True).content.decode()
    assert "Invitation to ken@uni.example.ac.jp revoked." in done
    assert "No pending invitations." in done
    invitation.refresh_from_db()
    assert invitation.status == Invitation.Status.REVOKED
    again = admin.post(revoke, follow=True).content.decode()
    assert "the invitation is revoked" in again
    # another project's invitation is not there, exactly like a missing one, and stays
    theirs, _ = invitations.invitation_create(project=make_project(), email="x@uni.example.ac.jp")
    assert admin.post(url("invitation-revoke", project, pk=theirs.pk)).status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == Invitation.Status.PENDING


def test_a_bad_ssh_key_is_explained(login, cloud):
    response = login(cloud["users"][Role.READER]).post(
        reverse("portal:ssh-keys"), {"public_key": "ssh-rsa AAAAnotbase64"}
    )
    assert response.status_code == 400
    assert errors_of(response, "public_key")


def test_a_token_is_shown_once(login, project, cloud):
    client = login(cloud["users"][Role.MEMBER])
    response = client.post(reverse("portal:tokens"), {"name": "laptop", "project": project.slug})
    secret = re.search(r'<pre id="token-secret">(kumo_\w+_[\w-]+)</pre>', response.content.decode())
    assert response.status_code == 200 and secret
    token = ApiToken.objects.get(name="laptop")
    assert token.project == project and secret.group(1) not in str(token.__dict__)
    assert secret.group(1) not in client.get(reverse("portal:tokens")).content.decode()
    client.post(reverse("portal:token-revoke", kwargs={"pk": token.pk}))
    token.refresh_from_db()
    assert token.revoked_at is not None


# --- billing ----------------------------------------------------------------------------------


def test_an_invoice_downloads_as_the_apis_csv(login, project, cloud, rate_card):
    today = timezone.now().date()
    last_month = billing.month_start(billing.month_start(today) - timedelta(days=1))
    [invoice] = billing.invoices_issue(period=last_month, projects=[project])
    reader = login(cloud["users"][Role.READER])
    page = reader.get(url("billing", project)).content.decode()
    assert url("invoice-csv", project, pk=invoice.pk) in page
    response = reader.get(url("invoice-csv", project, pk=invoice.pk))
    assert response["Content-Type"].startswith("text/csv")
    assert response.content.decode() == billing.invoice_csv(invoice.document)
    assert response["X-Content-SHA256"] == invoice.content_hash
    other = make_project()
    assert reader.get(url("invoice-csv", other, pk=invoice.pk)).status_code == 404


def test_budgets_are_admins_and_bad_thresholds_name_the_field(login, project, cloud, rate_card):
    data = {"name": "monthly", "amount": "100000", "thresholds": "50, 80, 100", "policy": "notify"}
    response = login(cloud["users"][Role.MEMBER]).post(url("billing", project), data)
    assert response.status_code == 403
    admin = login(cloud["users"][Role.ADMIN])
    response = admin.post(url("billing", project), data | {"thresholds": "50, 50"})
    assert response.status_code == 400
    assert "must not repeat" in errors_of(response, "thresholds")
    assert admin.post(url("billing", project), data).status_code == 302
    assert Budget.objects.for_project(project).get().thresholds == [50, 80, 100]


# --- the audit log -----------------------------------------------------------------------------


def test_the_audit_log_lists_the_projects_trail_only(login, project, cloud):
    make_network(project, name="lab")
    other = make_project()
    make_network(other, name="theirs")
    page = login(cloud["users"][Role.READER]).get(url("audit", project), {"action": "network"})
    html = page.content.decode()
    assert "network.create" in html or "<code>network" in html
    assert "theirs" not in html


# --- the event feed ---------------------------------------------------------------------------


def test_the_event_feed_is_the_projects_newest_first_filtered(login, project, cloud):
    from controlplane import events

    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], name="feed-1")
    events.emit("budget.threshold", project=project, message="Budget at 80 %")
    events.emit("vm.eviction_notice", project=project, message="feed-1 is evicted", obj=vm)
    events.emit("vm.eviction_notice", project=make_project(), message="theirs is evicted")
    client = login(cloud["users"][Role.READER])
    html = client.get(url("events", project)).content.decode()
    assert html.index("feed-1 is evicted") < html.index("Budget at 80 %")  # newest first
    assert "theirs" not in html
    assert url("vm-detail", project, pk=vm.pk) in html
    by_kind = client.get(url("events", project), {"kind": "budget."}).content.decode()
    assert "Budget at 80 %" in by_kind and "feed-1 is evicted" not in by_kind
    by_object = client.get(url("events", project), {"object": str(vm.pk)}).content.decode()
    assert "feed-1 is evicted" in by_object and "Budget at 80 %" not in by_object
    by_type = client.get(url("events", project), {"object": "virtualmachine"}).content.decode()
    assert "feed-1 is evicted" in by_type and "Budget at 80 %" not in by_type
    dashboard = client.get(url("dashboard", project)).content.decode()
    assert url("events", project) in dashboard


# --- the fleet --------------------------------------------------------------------------------


def test_the_fleet_is_for_staff_only(login, cloud, staff):
    assert login(cloud["users"][Role.OWNER]).get(reverse("portal:fleet")).status_code == 404
    assert login(staff).get(reverse("portal:fleet")).status_code == 200


def test_the_fleet_grid_tells_spot_on_demand_and_free(login, project, cloud, staff):
    make_vm(project, template=cloud["gpu"], image=cloud["image"])
    make_vm(project, template=cloud["gpu"], image=cloud["image"], priority=Priority.SPOT)
    html = login(staff).get(reverse("portal:fleet")).content.decode()
    row = re.search(rf'data-host="{cloud["host"].name}">(.*?)</tr>', html, re.S).group(1)
    cells = re.findall(r'data-occupancy="(\w+)"', row)
    assert sorted(cells) == ["free"] * 6 + ["on_demand", "spot"]
    assert re.search(r'id="gpus-spot">1<', html)


def test_operators_drain_and_return_a_host(login, cloud, staff):
    host = cloud["host"]
    client = login(staff)
    response = client.post(
        reverse("portal:host-state", kwargs={"name": host.name}),
        {"state": "draining", "reason": "fan"},
        follow=True,
    )
    host.refresh_from_db()
    assert (host.state, host.state_reason) == (HostState.DRAINING, "fan")
    assert f"{host.name} is draining" in response.content.decode()
    client.post(reverse("portal:host-state", kwargs={"name": host.name}), {"state": "up"})
    host.refresh_from_db()
    assert host.state == HostState.UP
    response = client.post(
        reverse("portal:host-state", kwargs={"name": host.name}), {"state": "up"}, follow=True
    )
    assert "only a draining or maintenance host" in response.content.decode()
    owner = login(cloud["users"][Role.OWNER])
    refused = owner.post(
        reverse("portal:host-state", kwargs={"name": host.name}), {"state": "draining"}
    )
    assert refused.status_code == 404


# --- cost ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vm-rows", "fleet"])
def test_polled_and_fleet_pages_cost_the_same_queries_whatever_their_size(
    login, project, cloud, staff, name
):
    make_network(project, name="lab")
    network = Network.objects.for_project(project).get(name="lab")
    client = login(staff if name == "fleet" else cloud["users"][Role.READER])
    target = reverse("portal:fleet") if name == "fleet" else url(name, project)

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert client.get(target).status_code == 200
        return len(captured)

    make_vm(project, template=cloud["gpu"], image=cloud["image"], nics=[{"network": network}])
    one = queries()
    for _ in range(4):
        make_vm(project, template=cloud["gpu"], image=cloud["image"], nics=[{"network": network}])
    assert queries() == one


@override_settings(CONSOLE_LOG_WAIT_S=0.05)
def test_reset_power_off_and_the_console_log_page(login, project, cloud):
    """The rescue buttons of a running VM go through the service; the console-log page
    asks the host (which does not answer in this test) and says so; a reader may not
    read the console."""
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"])
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    client = login(cloud["users"][Role.MEMBER])
    html = client.get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert ">Reset</button>" in html and ">Power off</button>" in html
    response = client.post(url("vm-action", project, pk=vm.pk, action="reset"), follow=True)
    assert f"Reset of VM {vm.name} requested" in response.content.decode()
    vm.refresh_from_db()
    assert vm.task_state == "resetting"
    html = client.get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert ">Power off</button>" in html and ">Reset</button>" not in html  # overrules
    response = client.post(url("vm-action", project, pk=vm.pk, action="power_off"), follow=True)
    assert f"Power-off of VM {vm.name} requested" in response.content.decode()
    page = client.get(url("vm-console-log", project, pk=vm.pk)).content.decode()
    assert "has not answered yet" in page
    reader = login(cloud["users"][Role.READER]).get(url("vm-console-log", project, pk=vm.pk))
    assert "Only members" in reader.content.decode()


def test_a_subnets_dns_servers_are_set_from_the_networks_page(login, project, cloud):
    from network.models import Subnet
    from tests.factories import make_network

    make_network(project, "names", cidr="10.32.0.0/24")
    subnet = Subnet.objects.get(network__name="names", project=project)
    client = login(cloud["users"][Role.MEMBER])
    html = client.get(url("networks", project)).content.decode()
    assert "the network's resolver (10.32.0.1)" in html
    done = client.post(
        url("subnet-dns", project, pk=subnet.pk), {"dns_servers": "9.9.9.9, 1.1.1.1"}, follow=True
    )
    assert "guests are told 9.9.9.9, 1.1.1.1" in done.content.decode()
    subnet.refresh_from_db()
    assert subnet.dns_servers == ["9.9.9.9", "1.1.1.1"]
    bad = client.post(url("subnet-dns", project, pk=subnet.pk), {"dns_servers": "x"}, follow=True)
    assert "is not an IPv4 address" in bad.content.decode()
