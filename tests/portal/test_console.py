"""The portal's interactive console page: linked from a running VM's page, it loads the
vendored xterm.js and asks the portal for a token (the same service as the API's
``console`` action); readers and VMs not running get the reason instead."""

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse

from compute.choices import VmState
from compute.models import ConsoleToken, Host, VirtualMachine
from controlplane.models import AuditEvent
from tenants.choices import Role
from tests.factories import make_vm

pytestmark = pytest.mark.django_db


def url(name, project, **kwargs):
    return reverse(f"portal:{name}", kwargs={"slug": project.slug, **kwargs})


@pytest.fixture
def running_vm(project, cloud):
    Host.objects.filter(pk=cloud["host"].pk).update(libvirt_uri="qemu:///system")
    vm = make_vm(project, template=cloud["cpu"], image=cloud["image"])
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING)
    return VirtualMachine.objects.get(pk=vm.pk)


def test_a_member_opens_the_console_page_and_gets_a_token(login, project, cloud, running_vm):
    member = cloud["users"][Role.MEMBER]
    client = login(member, csrf=True)
    detail = client.get(url("vm-detail", project, pk=running_vm.pk)).content.decode()
    assert url("vm-console", project, pk=running_vm.pk) in detail
    html = client.get(url("vm-console", project, pk=running_vm.pk)).content.decode()
    for asset in ("vendor/xterm/xterm.js", "vendor/xterm/addon-fit.js", "portal/console.js"):
        assert asset in html
    assert url("vm-console-token", project, pk=running_vm.pk) in html
    csrf = client.cookies["csrftoken"].value
    answer = client.post(url("vm-console-token", project, pk=running_vm.pk), HTTP_X_CSRFTOKEN=csrf)
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["url"].endswith(f"/vms/{running_vm.pk}/?token={body['token']}")
    assert ConsoleToken.objects.get().user == member
    assert AuditEvent.objects.get(action="vm.console").source == "portal"
    # The vendored files are there to serve (nothing is fetched at run time).
    for path in ("xterm.js", "xterm.css", "addon-fit.js", "LICENSE"):
        assert finders.find(f"portal/vendor/xterm/{path}"), path


def test_readers_and_stopped_vms_get_the_reason(login, project, cloud, running_vm):
    reader = login(cloud["users"][Role.READER])
    page = reader.get(url("vm-console", project, pk=running_vm.pk)).content.decode()
    assert "Only members" in page and "console.js" not in page
    assert reader.post(url("vm-console-token", project, pk=running_vm.pk)).status_code == 403
    VirtualMachine.objects.filter(pk=running_vm.pk).update(state=VmState.STOPPED)
    member = login(cloud["users"][Role.MEMBER])
    page = member.get(url("vm-console", project, pk=running_vm.pk)).content.decode()
    assert "only a running VM has a console" in page
    refused = member.post(url("vm-console-token", project, pk=running_vm.pk))
    assert refused.status_code == 409 and "stopped" in refused.json()["message"]
    assert not ConsoleToken.objects.exists()
