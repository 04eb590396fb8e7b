"""Console tokens (``compute.services.consoles``) through the API and as the proxy redeems
them: issued to a member for a running VM on a real host, bound to that VM, that user and
that host, usable once within the TTL; every refusal names its reason and is audited."""

from datetime import timedelta

import pytest
from django.utils import timezone

from compute.choices import VmState, VmTask
from compute.models import ConsoleToken, Host, VirtualMachine
from compute.services.consoles import ConsoleRefused, console_token_redeem
from controlplane.models import AuditEvent
from tenants import services as tenants
from tenants.choices import Role
from tests.factories import add_member, make_host, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client_for, project):
    tenants.quota_set(project=project, vcpus=1024, memory_gib=8192, gpus=64, vms=64)
    return client_for(project.owner)


def _vm(project, state=VmState.RUNNING, name=None):
    """A VM placed on host cpu-07 (a real host: its agent reports qemu:///system)."""
    if not Host.objects.filter(name="cpu-07").exists():
        make_host("cpu-07", kind="cpu")
        Host.objects.filter(name="cpu-07").update(libvirt_uri="qemu:///system")
    vm = make_vm(project, **({"name": name} if name else {}))
    VirtualMachine.objects.filter(pk=vm.pk).update(state=state, task_state=VmTask.NONE)
    return VirtualMachine.objects.get(pk=vm.pk)


def url(project, vm):
    return f"/api/v1/projects/{project.slug}/vms/{vm.pk}/console/"


def _issue(client, project, vm):
    answer = client.post(url(project, vm))
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_a_member_gets_a_short_lived_token_and_its_websocket_url(api, project):
    vm = _vm(project)
    before = timezone.now()
    body = _issue(api, project, vm)
    assert set(body) == {"url", "token", "expires_at"}
    assert body["url"].startswith("ws://") and body["url"].endswith(f"?token={body['token']}")
    assert f"/vms/{vm.pk}/?" in body["url"]
    row = ConsoleToken.objects.get()
    assert (row.vm_id, row.user_id, row.host_id) == (vm.pk, project.owner.pk, vm.host_id)
    assert row.digest != body["token"] and body["token"] not in row.digest  # only its hash
    assert before + timedelta(seconds=59) < row.expires_at <= timezone.now() + timedelta(seconds=60)
    event = AuditEvent.objects.get(action="vm.console")
    assert event.object_id == str(vm.pk) and event.actor == project.owner
    assert body["token"] not in str(event.detail)


def test_the_token_opens_the_console_once_for_its_vm(api, project):
    vm = _vm(project)
    token = _issue(api, project, vm)["token"]
    target = console_token_redeem(token, vm_id=str(vm.pk))
    assert (target.vm_id, target.host) == (str(vm.pk), "cpu-07")
    assert target.libvirt_uri == "qemu:///system"
    with pytest.raises(ConsoleRefused, match="used already"):
        console_token_redeem(token, vm_id=str(vm.pk))
    outcomes = list(
        AuditEvent.objects.filter(action="vm.console_connect").values_list("outcome", flat=True)
    )
    assert sorted(outcomes) == ["denied", "success"]


def test_the_libvirt_uri_template_names_the_host(api, project, settings):
    settings.CONSOLE_LIBVIRT_URI = "qemu+tls://{host}.mgmt.example/system"
    vm = _vm(project)
    target = console_token_redeem(_issue(api, project, vm)["token"], vm_id=str(vm.pk))
    assert target.libvirt_uri == "qemu+tls://cpu-07.mgmt.example/system"


@pytest.mark.parametrize(
    "case, reason",
    [
        ("tampered", "token: unknown"),
        ("empty", "token: missing or malformed"),
        ("other vm", "token: issued for another VM"),
        ("bad vm id", "vm: not a VM id"),
        ("other user's session", "token: issued to another user"),
        ("expired", "token: expired"),
        ("removed from the project", "user: no longer a member"),
        ("demoted to reader", "user: no longer a member"),
        ("deactivated", "user: no longer active"),
        ("stopped since", "vm: stopped, not running"),
        ("moved host", "vm: no longer on the host"),
    ],
)
def test_the_proxy_refuses(client_for, project, case, reason):
    member = add_member(project, role=Role.MEMBER)
    vm, other = _vm(project), _vm(project, name="other")
    token = _issue(client_for(member), project, vm)["token"]
    vm_id, session_user = str(vm.pk), None
    if case == "tampered":
        token = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    elif case == "empty":
        token = ""
    elif case == "other vm":
        vm_id = str(other.pk)
    elif case == "bad vm id":
        vm_id = "../etc"
    elif case == "other user's session":
        session_user = project.owner.pk
    elif case == "expired":
        ConsoleToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    elif case == "removed from the project":
        tenants.membership_remove(membership=member.memberships.get(project=project))
    elif case == "demoted to reader":
        member.memberships.update(role=Role.READER)
    elif case == "deactivated":
        type(member).objects.filter(pk=member.pk).update(is_active=False)
    elif case == "stopped since":
        VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.STOPPED)
    elif case == "moved host":
        VirtualMachine.objects.filter(pk=vm.pk).update(host=make_host("cpu-08", kind="cpu"))
    with pytest.raises(ConsoleRefused) as refused:
        console_token_redeem(token, vm_id=vm_id, session_user_id=session_user)
    assert refused.value.message.startswith(reason)
    if case not in ("tampered", "empty"):
        event = AuditEvent.objects.get(action="vm.console_connect")
        assert event.outcome == "denied" and event.detail["reason"].startswith(reason)
        assert event.actor == member


def test_the_same_users_session_is_fine(client_for, project):
    member = add_member(project, role=Role.MEMBER)
    vm = _vm(project)
    token = _issue(client_for(member), project, vm)["token"]
    assert console_token_redeem(token, vm_id=str(vm.pk), session_user_id=member.pk)


def test_a_vm_not_running_is_a_409_naming_its_state(api, project):
    stopped = _vm(project, VmState.STOPPED)
    answer = api.post(url(project, stopped))
    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert body["details"]["state"] == ["stopped"] and "running" in body["message"]
    assert not ConsoleToken.objects.exists()


@pytest.mark.parametrize(
    "uri, says", [("test:///default", "simulated"), ("", "KUMO_CONSOLE_LIBVIRT_URI")]
)
def test_a_vm_whose_host_the_proxy_cannot_reach_is_a_409_saying_why(api, project, uri, says):
    vm = _vm(project)
    Host.objects.filter(pk=vm.host_id).update(libvirt_uri=uri)
    answer = api.post(url(project, vm))
    assert answer.status_code == 409 and says in answer.json()["message"]
    assert answer.json()["code"] == "console_unavailable"


def test_readers_may_not_and_other_projects_see_nothing(client_for, project, other_project):
    vm = _vm(project)
    reader = client_for(add_member(project, role=Role.READER))
    assert reader.post(url(project, vm)).status_code == 403
    stranger = client_for(other_project.owner)
    assert stranger.post(url(project, vm)).status_code in (403, 404)
    # Another project's member naming the VM under their own project: 404, like a missing one.
    assert stranger.post(url(other_project, vm)).status_code == 404
    bad = client_for(project.owner).post(f"/api/v1/projects/{project.slug}/vms/not-a-uuid/console/")
    assert bad.status_code == 404
    assert not ConsoleToken.objects.exists()
