"""The admin console for compute: every page renders for an operator, nothing is edited by
hand, and the host actions go through the services (state changes audited)."""

import pytest
from django.urls import reverse

from compute.choices import HostState
from compute.models import Device, Host, Image, PlacementGroup, Template, VirtualMachine
from controlplane.models import AuditEvent
from tests.factories import make_host, make_vm

pytestmark = pytest.mark.django_db


@pytest.fixture
def console(client, staff):
    client.force_login(staff)
    return client


@pytest.mark.parametrize(
    "model",
    [Host, Device, Template, Image, PlacementGroup, VirtualMachine],
    ids=lambda m: m.__name__,
)
def test_every_compute_page_renders(console, project, model):
    host = make_host("gpu-01")
    vm = make_vm(project)
    app, name = model._meta.app_label, model._meta.model_name
    assert console.get(reverse(f"admin:{app}_{name}_changelist")).status_code == 200
    obj = {Host: host, VirtualMachine: vm, Device: host.devices.first()}.get(model)
    if obj is not None:
        assert console.get(reverse(f"admin:{app}_{name}_change", args=[obj.pk])).status_code == 200


def test_devices_and_vms_are_read_only(console, project):
    vm = make_vm(project)
    assert console.get(reverse("admin:compute_virtualmachine_add")).status_code == 403
    response = console.post(reverse("admin:compute_virtualmachine_delete", args=[vm.pk]))
    assert response.status_code == 403
    assert VirtualMachine.objects.filter(pk=vm.pk).exists()


def test_drain_action_goes_through_the_service_and_is_audited(console):
    host = make_host("gpu-01")
    response = console.post(
        reverse("admin:compute_host_changelist"),
        {"action": "drain", "_selected_action": [host.pk]},
    )
    assert response.status_code == 302
    host.refresh_from_db()
    assert host.state == HostState.DRAINING
    assert AuditEvent.objects.filter(object_id=str(host.pk), action__startswith="host.").exists()
