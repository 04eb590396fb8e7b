"""The portal's leases page (a timeline of the project's leases, reserving and cancelling
by admins, a refusal showing the earliest period that fits), the launch form's lease, the
operators' calendar of the next 30 days, placement groups and the reclamation page."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from compute import services
from compute.choices import LeaseState, PlacementPolicy, VmState
from compute.models import Lease, PlacementGroup, VirtualMachine
from controlplane.choices import AuditOutcome
from controlplane.models import AuditEvent
from tenants import services as tenants
from tenants.choices import Role
from tests.factories import make_project, make_vm

pytestmark = pytest.mark.django_db

MODEL = "A100-SXM4-40GB"


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


def errors_of(response, field):
    html = response.content.decode()
    found = re.search(rf'<ul class="errorlist" role="alert" data-field="{field}">(.*?)</ul>', html)
    return found.group(1) if found else ""


_now: list = []  # the test's "now", read once: at(1) and at(3) are exactly 2 h apart


@pytest.fixture(autouse=True)
def _one_now():
    _now[:] = [timezone.now().replace(second=0, microsecond=0)]


def at(hours: float):
    return _now[0] + timedelta(hours=hours)


def local(moment) -> str:
    """As a browser's datetime-local field sends it (UTC here)."""
    return moment.strftime("%Y-%m-%dT%H:%M")


def reserve(project, gpus, start, end, name):
    return services.lease_create(
        project=project, name=name, gpus=gpus, starts_at=start, ends_at=end, gpu_model=MODEL
    )


def form(name="run", gpus=2, start=None, end=None, **more):
    start = start or at(2)
    end = end or start + timedelta(hours=4)
    return {
        "name": name,
        "gpus": str(gpus),
        "gpu_model": MODEL,
        "starts_at": local(start),
        "ends_at": local(end),
        **more,
    }


def test_an_admin_reserves_and_the_lease_is_on_the_timeline(login, project, cloud):
    admin = cloud["users"][Role.ADMIN]
    client = login(admin)
    page = client.get(url("leases", project)).content.decode()
    assert 'id="id_lend_idle" checked' in page  # lent unless unticked
    response = client.post(url("leases", project), form(name="train", lend_idle="on"), follow=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Lease train reserved: 2 A100-SXM4-40GB GPUs" in html
    lease = Lease.objects.for_project(project).get(name="train")
    assert lease.state == LeaseState.SCHEDULED and lease.created_by == admin
    assert lease.lend_idle and "kept idle" not in html
    assert 'data-lease="train"' in html and 'class="bar-fill"' in html
    event = AuditEvent.objects.for_project(project).get(action="lease.create")
    assert event.actor == admin and event.source == "portal"


def test_an_admin_reserves_a_whole_host(login, project, cloud):
    response = login(project.owner).post(
        url("leases", project), form(name="node", gpus="", hosts="1"), follow=True
    )
    html = response.content.decode()
    assert "Lease node reserved: 1 whole hosts (8 A100-SXM4-40GB GPUs)" in html
    assert "(whole hosts: 1)" in html
    node = Lease.objects.for_project(project).get(name="node")
    assert node.hosts == 1 and not node.lend_idle  # the box left unticked: it keeps them idle
    assert "(kept idle for its VMs)" in html


def test_a_refusal_shows_the_earliest_period_that_fits(login, project, cloud):
    reserve(project, 8, at(1), at(3), "first")
    response = login(project.owner).post(
        url("leases", project), form(name="second", gpus=4, start=at(2), end=at(4))
    )
    assert response.status_code == 409
    assert "do not fit" in errors_of(response, "gpus")
    html = response.content.decode()
    assert 'id="earliest"' in html
    assert f"from {at(3):%Y-%m-%d %H:%M} to {at(5):%Y-%m-%d %H:%M} UTC" in html
    assert f'name="starts_at" value="{local(at(3))}"' in html
    assert not Lease.objects.filter(name="second").exists()


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"gpus": "0"}, "gpus", "greater than or equal to 1"),
        ({"gpus": "two"}, "gpus", "whole number"),
        ({"name": "Not A Name"}, "name", ""),
        ({"starts_at": "tomorrow"}, "starts_at", "valid date/time"),
        ({"gpu_model": "H100"}, "gpu_model", "valid choice"),
        ({"hosts": "1"}, "gpus", "either GPUs or whole hosts"),
        ({"gpus": ""}, "gpus", "either GPUs or whole hosts"),
        ({"gpus": "", "hosts": "0"}, "hosts", "greater than or equal to 1"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(login, project, cloud, data, field, says):
    response = login(project.owner).post(url("leases", project), {**form(), **data})
    assert response.status_code == 400
    assert errors_of(response, field) and says in errors_of(response, field)
    assert not Lease.objects.exists()


def test_the_end_before_the_start_and_a_past_start_name_their_field(login, project, cloud):
    client = login(project.owner)
    backwards = client.post(url("leases", project), form(start=at(5), end=at(2)))
    assert backwards.status_code == 400
    assert "after the start" in errors_of(backwards, "ends_at")
    past = client.post(url("leases", project), form(start=at(-5), end=at(2)))
    assert past.status_code == 400
    assert "must not be in the past" in errors_of(past, "starts_at")


def test_members_see_leases_but_only_admins_reserve_and_cancel(login, project, cloud):
    lease = reserve(project, 1, at(2), at(3), "mine")
    member = cloud["users"][Role.MEMBER]
    client = login(member)
    page = client.get(url("leases", project)).content.decode()
    assert 'data-lease="mine"' in page and 'id="lease-create"' not in page and "Cancel" not in page
    assert client.post(url("leases", project), form(name="more")).status_code == 403
    assert client.post(url("lease-cancel", project, pk=lease.pk)).status_code == 403
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.SCHEDULED
    assert AuditEvent.objects.for_project(project).filter(outcome=AuditOutcome.DENIED).count() == 2


def test_an_admin_cancels(login, project, cloud):
    lease = reserve(project, 1, at(2), at(3), "mine")
    response = login(project.owner).post(url("lease-cancel", project, pk=lease.pk), follow=True)
    assert "Lease mine cancelled." in response.content.decode()
    assert Lease.objects.get(pk=lease.pk).state == LeaseState.CANCELLED
    assert AuditEvent.objects.for_project(project).filter(action="lease.cancel").exists()


def test_an_admin_switches_lending_and_a_member_cannot(login, project, cloud):
    lease = reserve(project, 1, at(2), at(3), "mine")
    assert (
        "data-lending>Keep idle GPUs for its VMs"
        in login(project.owner).get(url("leases", project)).content.decode()
    )
    lending = url("lease-lending", project, pk=lease.pk)
    member = login(cloud["users"][Role.MEMBER])
    assert member.post(lending, {"lend_idle": "0"}).status_code == 403
    client = login(project.owner)
    response = client.post(lending, {"lend_idle": "0"}, follow=True)
    html = response.content.decode()
    assert "Lease mine keeps its idle GPUs for its VMs." in html
    assert "(kept idle for its VMs)" in html and "data-lending>Lend idle GPUs to spot VMs" in html
    assert not Lease.objects.get(pk=lease.pk).lend_idle
    event = AuditEvent.objects.for_project(project).get(action="lease.update")
    assert event.source == "portal" and event.detail["lend_idle"] is False
    # A value that is neither is refused, naming the field, and audited.
    bad = client.post(lending, {"lend_idle": "yes"}, follow=True)
    assert "lend_idle: 1 (lend) or 0 (keep idle)" in bad.content.decode()
    refused = AuditEvent.objects.for_project(project).get(outcome=AuditOutcome.FAILED)
    assert refused.detail["details"] == {"lend_idle": ["1 (lend) or 0 (keep idle)"]}
    assert not Lease.objects.get(pk=lease.pk).lend_idle


def test_an_admin_changes_the_end_and_the_size_and_sees_what_fits(login, project, cloud):
    lease = reserve(project, 6, at(2), at(3), "mine")
    reserve(make_project(), 4, at(5), at(6), "theirs")
    moving = url("lease-change", project, pk=lease.pk)
    client = login(project.owner)
    page = client.get(url("leases", project)).content.decode()
    assert f'action="{moving}"' in page and f'value="{local(at(3))}"' in page
    assert 'name="gpus" min="1" value="6"' in page
    assert f'name="starts_at" value="{local(at(2))}"' in page  # scheduled: its start moves
    member = login(cloud["users"][Role.MEMBER])
    assert member.post(moving, {"ends_at": local(at(4))}).status_code == 403

    response = client.post(moving, {"ends_at": local(at(4)), "gpus": "6"}, follow=True)
    assert f"Lease mine ends at {at(4):%Y-%m-%d %H:%M} UTC." in response.content.decode()
    assert "GPUs." not in response.content.decode()  # the size as it was: not asked for
    assert Lease.objects.get(pk=lease.pk).ends_at == at(4)
    event = AuditEvent.objects.for_project(project).get(action="lease.update")
    assert event.source == "portal" and event.detail["ends_at"] == at(4).isoformat()
    # Past the next lease's start it does not fit: the refusal names the latest end that does.
    refused = client.post(moving, {"ends_at": local(at(6))}, follow=True).content.decode()
    assert f"the latest end that fits is {at(5).isoformat()}" in refused
    assert Lease.objects.get(pk=lease.pk).ends_at == at(4)
    bad = client.post(moving, {"ends_at": "tomorrow"}, follow=True).content.decode()
    assert "ends_at: a date and time, such as 2026-12-01 09:00" in bad
    # The size: fewer is given back; more than fit names the most that do.
    fewer = client.post(moving, {"ends_at": local(at(4)), "gpus": "2"}, follow=True)
    assert "Lease mine holds 2 GPUs." in fewer.content.decode()
    assert "ends at" not in fewer.content.decode()  # the end as it was: not asked for
    more = client.post(moving, {"ends_at": local(at(4)), "gpus": "9"}, follow=True)
    assert "it may hold 8 then" in more.content.decode()
    assert Lease.objects.get(pk=lease.pk).gpus == 2
    bad = client.post(moving, {"gpus": "zero"}, follow=True).content.decode()
    assert "gpus: a whole number, 1 or more" in bad
    later = {"starts_at": local(at(2.5)), "ends_at": local(at(4)), "gpus": "2"}
    moved = client.post(moving, later, follow=True).content.decode()
    expected = f"Lease mine runs from {at(2.5):%Y-%m-%d %H:%M} to {at(4):%Y-%m-%d %H:%M} UTC."
    assert expected in moved
    assert Lease.objects.get(pk=lease.pk).starts_at == at(2.5)


def test_a_vm_is_launched_in_a_lease(login, project, cloud):
    lease = reserve(project, 1, at(2), at(3), "mine")
    ended = reserve(project, 1, at(4), at(5), "over")
    services.lease_cancel(lease=ended)
    client = login(cloud["users"][Role.MEMBER])
    page = client.get(url("vm-create", project)).content.decode()
    assert f'<option value="{lease.pk}">' in page and f'<option value="{ended.pk}">' not in page
    data = {
        "name": "in-lease",
        "template": cloud["gpu"].name,
        "image": cloud["image"].pk,
        "priority": "on_demand",
        "lease": lease.pk,
    }
    response = client.post(url("vm-create", project), data)
    assert response.status_code == 302, errors_of(response, "lease")
    vm = VirtualMachine.objects.for_project(project).get(name="in-lease")
    assert vm.lease_id == lease.pk and vm.state == VmState.PENDING
    detail = client.get(url("vm-detail", project, pk=vm.pk)).content.decode()
    assert f'{url("leases", project)}">mine</a> (scheduled' in detail
    cpu = client.post(
        url("vm-create", project), {**data, "name": "cpu", "template": cloud["cpu"].name}
    )
    assert cpu.status_code == 400
    assert "choose a GPU template" in errors_of(cpu, "lease")


def test_operators_see_every_projects_leases_of_the_next_30_days(login, project, cloud, staff):
    other = make_project()
    tenants.quota_set(project=other, vcpus=64, memory_gib=256, gpus=8, vms=8)
    reserve(project, 1, at(2), at(3), "soon")
    reserve(other, 2, at(24 * 10), at(24 * 11), "later")
    reserve(other, 2, at(24 * 40), at(24 * 41), "far")
    response = login(staff).get(reverse("portal:fleet-leases"))
    html = response.content.decode()
    assert 'data-lease="soon"' in html and 'data-lease="later"' in html
    assert 'data-lease="far"' not in html
    assert other.slug in html
    assert login(project.owner).get(reverse("portal:fleet-leases")).status_code == 404


def test_placement_groups_are_made_and_deleted(login, project, cloud):
    client = login(cloud["users"][Role.MEMBER])
    made = client.post(url("placement-groups", project), {"name": "ring", "policy": "compact"})
    assert made.status_code == 302
    group = PlacementGroup.objects.for_project(project).get(name="ring")
    assert group.policy == PlacementPolicy.COMPACT
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], placement_group=group)
    page = client.get(url("placement-groups", project)).content.decode()
    assert 'data-group="ring"' in page
    refused = client.post(url("placement-group-delete", project, pk=group.pk), follow=True)
    assert "still has VMs" in refused.content.decode()
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.DELETED)
    client.post(url("placement-group-delete", project, pk=group.pk))
    assert not PlacementGroup.objects.filter(pk=group.pk).exists()
    actions = set(AuditEvent.objects.for_project(project).values_list("action", flat=True))
    assert {"placement_group.create", "placement_group.delete"} <= actions


def test_bad_placement_group_input_and_a_reader(login, project, cloud):
    client = login(project.owner)
    bad = client.post(url("placement-groups", project), {"name": "ring", "policy": "near"})
    assert bad.status_code == 400 and "valid choice" in errors_of(bad, "policy")
    client.post(url("placement-groups", project), {"name": "ring", "policy": "compact"})
    taken = client.post(url("placement-groups", project), {"name": "ring", "policy": "compact"})
    assert taken.status_code == 409 and "exists" in errors_of(taken, "name")
    reader = login(cloud["users"][Role.READER])
    assert (
        reader.post(
            url("placement-groups", project), {"name": "x", "policy": "compact"}
        ).status_code
        == 403
    )


def test_the_reclamation_page_shows_the_minimum_and_the_schedule(login, project, cloud, staff):
    services.guarantee_set(project=project, min_gpus=2, gpu_model=MODEL, actor=staff)
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"], name="idle-one")
    when = timezone.now() + timedelta(hours=6)
    VirtualMachine.objects.filter(pk=vm.pk).update(
        state=VmState.RUNNING,
        reclaim_action="stop",
        reclaim_reason="idle for 7 days",
        reclaim_at=when,
    )
    html = login(cloud["users"][Role.READER]).get(url("reclamation", project)).content.decode()
    assert '<div class="value" id="min-gpus">2</div>' in html
    assert "idle-one" in html and "idle for 7 days" in html and f"{when:%Y-%m-%d %H:%M}" in html
    assert "the fewest GPU-seconds: the work since their last checkpoint, plus 0:02:00" in html
    assert "may run up to 0:00:45 longer than the template&#x27;s" in html


def test_a_vm_is_launched_in_a_placement_group_of_the_project_only(login, project, cloud):
    group = services.placement_group_create(project=project, name="ring", policy="compact")
    other = make_project()
    theirs = services.placement_group_create(project=other, name="theirs", policy="compact")
    client = login(cloud["users"][Role.MEMBER])
    data = {
        "name": "member-1",
        "template": cloud["cpu"].name,
        "image": cloud["image"].pk,
        "priority": "on_demand",
        "placement_group": theirs.pk,
    }
    refused = client.post(url("vm-create", project), data)
    assert refused.status_code == 400 and "valid choice" in errors_of(refused, "placement_group")
    assert (
        client.post(url("vm-create", project), {**data, "placement_group": group.pk}).status_code
        == 302
    )
    assert VirtualMachine.objects.for_project(project).get(name="member-1").placement_group == group
