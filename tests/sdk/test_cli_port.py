"""``kumo port`` end to end, through typer's CliRunner against a live Kumo: the project's
ports listed (a VM's NICs and a port of its own, filtered by network or VM) and a port's
security groups, port security and name changed, with what the API refuses reported as
the CLI's errors."""

import json
import uuid

import pytest

from controlplane.choices import AuditOutcome, AuditSource
from controlplane.models import AuditEvent
from network.models import Port
from tests.factories import make_image, make_template

pytestmark = pytest.mark.e2e


@pytest.fixture
def nics(logged_in):
    """VM web-1 (not placed: no host runs it) with a NIC on lab, then one on data; the two
    ports, in NIC order."""
    logged_in("network", "create", "lab", "--cidr", "10.40.0.0/24")
    logged_in("network", "create", "data", "--cidr", "10.41.0.0/24")
    logged_in(
        "vm", "create", "web-1", "--template", make_template().name, "--image",
        str(make_image().pk), "--network", "lab", "--network", "data",
    )  # fmt: skip
    return list(Port.objects.filter(vm__name="web-1").order_by("device_index"))


def groups_of(port: Port) -> list[str]:
    return sorted(Port.objects.get(pk=port.pk).security_groups.values_list("name", flat=True))


def row_of(table: str, port_id) -> str:
    [row] = [line for line in table.splitlines() if str(port_id) in line]
    return row


def test_list_shows_the_nics_of_a_vm_and_a_port_of_its_own(logged_in, kumo, nics, monkeypatch):
    first, second = nics
    own = kumo.ports.create(network="data", name="probe")

    listed = {p["id"]: p for p in json.loads(logged_in("port", "list", "--json").stdout)}
    assert set(listed) == {str(first.pk), str(second.pk), own.id}
    shown = listed[str(first.pk)]
    assert (shown["network"], shown["vm"], shown["mac"]) == ("lab", str(first.vm_id), first.mac)
    assert shown["security_groups"] == ["default"] and shown["port_security"] is True
    assert shown["fixed_ips"][0].startswith("10.40.0.")
    assert listed[own.id]["vm"] is None

    monkeypatch.setenv("COLUMNS", "250")  # one line per row, however wide the ids
    table = logged_in("port", "list").stdout
    assert table.split()[:9] == [
        "ID", "NAME", "NETWORK", "VM", "MAC", "ADDRESSES", "SECURITY", "GROUPS", "PORT",
    ]  # fmt: skip
    assert row_of(table, first.pk).split() == [
        str(first.pk), "-", "lab", "web-1", first.mac, shown["fixed_ips"][0], "default", "yes",
    ]  # fmt: skip
    assert row_of(table, own.id).split()[1:4] == ["probe", "data", "-"]


def test_list_filters_by_network_and_by_vm(logged_in, kumo, project, nics):
    first, second = nics
    own = kumo.ports.create(network="data")

    on_data = json.loads(logged_in("port", "list", "--network", "data", "--json").stdout)
    assert {p["id"] for p in on_data} == {str(second.pk), own.id}
    of_vm = json.loads(logged_in("port", "list", "--vm", "web-1", "--json").stdout)
    assert {p["id"] for p in of_vm} == {str(first.pk), str(second.pk)}
    both = logged_in("port", "list", "--vm", "web-1", "--network", "lab", "--json").stdout
    assert [p["id"] for p in json.loads(both)] == [str(first.pk)]

    missing = logged_in("port", "list", "--network", "nowhere", ok=False)
    assert missing.exit_code == 1
    assert f"no network 'nowhere' in project {project.slug}" in missing.stderr


def test_update_replaces_the_groups_and_is_audited(logged_in, owner, nics):
    first, second = nics
    logged_in("security-group", "create", "web")

    done = logged_in("port", "update", str(first.pk), "--security-group", "web",
                     "--security-group", "default")  # fmt: skip
    assert f"Port {first.pk}: security groups default, web; port security on." in done.stderr
    assert groups_of(first) == ["default", "web"] and groups_of(second) == ["default"]
    event = AuditEvent.objects.get(action="port.update", object_id=str(first.pk))
    assert (event.actor, event.source, event.outcome) == (
        owner,
        AuditSource.API,
        AuditOutcome.SUCCESS,
    )
    assert event.detail == {"security_groups": ["web", "default"], "port_security": None}

    answer = json.loads(
        logged_in("port", "update", str(first.pk), "--security-group", "web", "--json").stdout
    )
    assert answer["id"] == str(first.pk) and answer["security_groups"] == ["web"]
    assert groups_of(first) == ["web"]


def test_only_what_is_given_changes(logged_in, nics):
    first, _ = nics

    done = logged_in("port", "update", str(first.pk), "--no-port-security")
    assert "security groups default; port security off." in done.stderr
    port = Port.objects.get(pk=first.pk)
    assert port.port_security is False and groups_of(first) == ["default"]

    logged_in("port", "update", str(first.pk), "--name", "eth0")
    port = Port.objects.get(pk=first.pk)
    assert (port.name, port.port_security) == ("eth0", False) and groups_of(first) == ["default"]

    logged_in("port", "update", str(first.pk), "--port-security")
    assert Port.objects.get(pk=first.pk).port_security is True


def test_no_security_groups_leaves_none(logged_in, nics):
    first, second = nics

    done = logged_in("port", "update", str(first.pk), "--no-security-groups")
    assert f"Port {first.pk}: security groups none; port security on." in done.stderr
    assert groups_of(first) == [] and groups_of(second) == ["default"]
    [shown] = json.loads(logged_in("port", "list", "--network", "lab", "--json").stdout)
    assert shown["security_groups"] == []


def test_vm_picks_its_first_nic(logged_in, nics):
    first, second = nics
    logged_in("security-group", "create", "web")

    done = logged_in("port", "update", "--vm", "web-1", "--security-group", "web")
    assert f"Port {first.pk}: security groups web;" in done.stderr
    assert groups_of(first) == ["web"] and groups_of(second) == ["default"]


def test_a_group_the_project_lacks_is_refused_naming_the_field(logged_in, nics):
    first, _ = nics

    refused = logged_in("port", "update", str(first.pk), "--security-group", "nope", ok=False)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert "security_groups" in refused.stderr and "'nope'" in refused.stderr
    assert "400 invalid" in refused.stderr
    assert groups_of(first) == ["default"]
    assert not AuditEvent.objects.filter(action="port.update").exists()


def test_an_unknown_port_is_a_404(logged_in, nics):
    refused = logged_in("port", "update", str(uuid.uuid4()), "--port-security", ok=False)
    assert refused.exit_code == 1 and "404" in refused.stderr and refused.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "nothing to change"),
        (("--name", "x", "--security-group", "web", "--no-security-groups"), "not both"),
        (("--name", "x", "--vm", "web-1"), "exactly one of PORT_ID and --vm"),
    ],
)
def test_usage_mistakes_exit_1_and_change_nothing(logged_in, nics, args, message):
    first, _ = nics
    refused = logged_in("port", "update", str(first.pk), *args, ok=False)
    assert refused.exit_code == 1 and message in refused.stderr
    port = Port.objects.get(pk=first.pk)
    assert port.name == "" and groups_of(first) == ["default"]
    assert not AuditEvent.objects.filter(action="port.update").exists()


def test_update_needs_a_port(logged_in):
    refused = logged_in("port", "update", "--port-security", ok=False)
    assert refused.exit_code == 1 and "exactly one of PORT_ID and --vm" in refused.stderr
