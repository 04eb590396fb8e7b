"""`kumo vm console` and ``vms.console()`` against a live Kumo: the console proxy's URL with
a fresh token for a running VM; a stopped one is the API's 409, as a message."""

import pytest
from kumo_sdk import Conflict

from compute.choices import VmState
from compute.models import ConsoleToken, Host, VirtualMachine
from tests.factories import make_host, make_template, make_vm

pytestmark = pytest.mark.e2e


@pytest.fixture
def vm(project):
    host = make_host("cpu-31", kind="cpu")
    Host.objects.filter(pk=host.pk).update(libvirt_uri="qemu:///system")
    vm = make_vm(project, name="box", template=make_template())
    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.RUNNING, host=host)
    return vm


def test_the_sdk_and_the_cli_give_the_consoles_url(kumo, logged_in, owner, vm):
    ticket = kumo.vms.console(str(vm.pk))
    assert ticket.url.startswith("ws") and ticket.url.endswith(f"?token={ticket.token}")
    assert f"/vms/{vm.pk}/" in ticket.url and ticket.expires_at is not None
    printed = logged_in("vm", "console", "box")
    assert printed.stdout.strip().startswith("ws") and "?token=" in printed.stdout
    assert "expires" in printed.stderr
    assert ConsoleToken.objects.filter(vm=vm, user=owner).count() == 2

    VirtualMachine.objects.filter(pk=vm.pk).update(state=VmState.STOPPED)
    with pytest.raises(Conflict, match="only a running VM"):
        kumo.vms.console(str(vm.pk))
    refused = logged_in("vm", "console", "box", ok=False)
    assert refused.exit_code == 1 and "stopped" in refused.stderr
