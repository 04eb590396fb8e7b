"""The ``kumo`` CLI end to end, through typer's CliRunner against a live Kumo: login, project
use, networks, a VM created with --wait on a simulated host until it runs, --json output,
and the other command groups."""

import json
import stat

import pytest

from network.services import global_ip_pool_create
from tenants import services as tenants
from tenants.choices import Role
from tests.factories import add_member, make_image, make_project, make_template
from tests.sdk.conftest import PASSWORD, can_log_in

pytestmark = pytest.mark.e2e


def test_login_project_use_network_and_vm_create_wait(server, hosts, owner, project, kumo_cli):
    other = make_project(owner=owner)  # two projects: login cannot guess which one
    template, image = make_template(), make_image()
    can_log_in(owner)

    out = kumo_cli("login", server.url, "--username", owner.username, "--password", PASSWORD)
    assert f"as {owner.username}" in out.stderr and "No project chosen" in out.stderr
    config = json.loads(kumo_cli.config.read_text())
    assert config["token"].startswith("kumo_") and config["project"] is None
    assert stat.S_IMODE(kumo_cli.config.stat().st_mode) == 0o600

    listed = kumo_cli("project", "list").stdout
    assert project.slug in listed and other.slug in listed
    kumo_cli("project", "use", project.slug)
    assert json.loads(kumo_cli.config.read_text())["project"] == project.slug

    made = kumo_cli("network", "create", "lab", "--cidr", "10.20.0.0/24", "--json")
    made = json.loads(made.stdout)
    assert made["name"] == "lab" and made["vni"]
    assert "10.20.0.0/24" in kumo_cli("network", "list").stdout

    created = kumo_cli(
        "vm", "create", "train-1", "--template", template.name, "--image", image.name,
        "--network", "lab", "--wait", "--timeout", "90", "--json",
    )  # fmt: skip
    vm = json.loads(created.stdout)
    assert vm["state"] == "running" and vm["host"] == hosts[0]
    [nic] = vm["nics"]
    assert nic["network"] == "lab" and nic["fixed_ips"][0].startswith("10.20.0.")
    assert "running" in created.stderr  # the progress display's last state

    [listed_vm] = json.loads(kumo_cli("vm", "list", "--json").stdout)
    assert listed_vm["id"] == vm["id"] and listed_vm["state"] == "running"
    assert "train-1" in kumo_cli("vm", "list").stdout

    stopped = kumo_cli("vm", "stop", "train-1", "--wait", "--timeout", "60")
    assert "succeeded" in stopped.stderr
    assert json.loads(kumo_cli("vm", "show", "train-1", "--json").stdout)["state"] == "stopped"

    refused = kumo_cli("network", "delete", "lab", ok=False)  # the VM's NIC is on it
    assert refused.exit_code == 1 and "error:" in refused.stderr
    kumo_cli("vm", "delete", "train-1", "--wait", "--timeout", "60")
    assert json.loads(kumo_cli("vm", "list", "--json").stdout) == []
    kumo_cli("network", "delete", "lab")
    assert json.loads(kumo_cli("network", "list", "--json").stdout) == []


def test_project_delete_refuses_a_project_holding_something_then_deletes_it(
    server, logged_in, project
):
    from tenants.models import Project

    assert json.loads(logged_in.config.read_text())["project"] == project.slug
    logged_in("network", "create", "lab")
    refused = logged_in("project", "delete", project.slug, ok=False)
    assert refused.exit_code == 1
    assert f"project {project.slug} still holds resources (networks=1)" in refused.stderr
    assert Project.objects.filter(pk=project.pk).exists()
    logged_in("network", "delete", "lab")
    done = logged_in("project", "delete", project.slug)
    assert f"Project {project.slug} deleted. No project is chosen now" in done.stderr
    assert not Project.objects.filter(slug=project.slug).exists()
    assert json.loads(logged_in.config.read_text())["project"] is None


def test_errors_are_messages_with_their_fields_and_exit_1(server, logged_in, project):
    logged_in("network", "create", "dup")
    again = logged_in("network", "create", "dup", ok=False)
    assert again.exit_code == 1
    assert "a network named dup exists (409 conflict)" in again.stderr
    assert "name: taken" in again.stderr and again.stdout == ""

    bad = logged_in("network", "create", "small", "--cidr", "10.0.0.0/30", ok=False)
    assert "cidr:" in bad.stderr and "400 invalid" in bad.stderr

    missing = logged_in("vm", "show", "nothing-here", ok=False)
    assert f"no VM 'nothing-here' in project {project.slug}" in missing.stderr


def test_commands_need_a_login_and_a_readable_config(kumo_cli):
    result = kumo_cli("vm", "list", ok=False)
    assert result.exit_code == 1 and "not logged in" in result.stderr
    kumo_cli.config.parent.mkdir(parents=True)
    kumo_cli.config.write_text("{not json")
    result = kumo_cli("vm", "list", ok=False)
    assert result.exit_code == 1 and f"cannot read {kumo_cli.config}" in result.stderr


def test_tokens(logged_in):
    tokens = json.loads(logged_in("token", "list", "--json").stdout)
    assert len(tokens) == 1 and "*" in logged_in("token", "list").stdout
    secret = logged_in("token", "create", "ci").stdout.strip()
    assert secret.startswith("kumo_")
    [ci] = [t for t in json.loads(logged_in("token", "list", "--json").stdout) if t["name"] == "ci"]
    logged_in("token", "revoke", str(ci["id"]))
    [ci] = [t for t in json.loads(logged_in("token", "list", "--json").stdout) if t["name"] == "ci"]
    assert ci["revoked_at"] is not None


def test_security_groups_and_rules(logged_in):
    logged_in("security-group", "create", "web", "--description", "HTTP in")
    rule = json.loads(
        logged_in(
            "security-group", "rule-add", "web", "--protocol", "tcp", "--port", "8000-8080",
            "--remote-cidr", "0.0.0.0/0", "--json",
        ).stdout
    )  # fmt: skip
    assert (rule["port_min"], rule["port_max"], rule["protocol"]) == (8000, 8080, "tcp")
    table = logged_in("security-group", "list").stdout
    assert f"#{rule['id']} ingress tcp 8000-8080 from 0.0.0.0/0" in table
    logged_in("security-group", "rule-delete", str(rule["id"]))
    [web] = [
        g
        for g in json.loads(logged_in("security-group", "list", "--json").stdout)
        if g["name"] == "web"
    ]
    assert web["rules"] == []


def test_global_ips_and_port_forwards(logged_in, project):
    global_ip_pool_create(name="campus", cidr="198.51.100.0/24", gateway_ip="198.51.100.1")
    tenants.quota_set(project=project, global_ips=4)
    logged_in("network", "create", "lab", "--cidr", "10.30.0.0/24")
    logged_in("vm", "create", "web-1", "--template", make_template().name, "--image",
              str(make_image().pk), "--network", "lab")  # fmt: skip
    address = logged_in("global-ip", "allocate").stdout.strip()
    assert address.startswith("198.51.100.")

    forward = json.loads(
        logged_in(
            "port-forward",
            "create",
            address,
            "--external-port",
            "2222",
            "--internal-port",
            "22",
            "--vm",
            "web-1",
            "--json",
        ).stdout
    )
    assert (forward["global_ip"], forward["external_port"], forward["internal_port"]) == (
        address,
        2222,
        22,
    )
    assert [f["id"] for f in json.loads(logged_in("port-forward", "list", "--json").stdout)] == [
        forward["id"]
    ]
    logged_in("port-forward", "delete", str(forward["id"]))
    assert json.loads(logged_in("port-forward", "list", "--json").stdout) == []

    associated = json.loads(
        logged_in("global-ip", "associate", address, "--vm", "web-1", "--json").stdout
    )
    assert associated["port"] == forward["port"]
    logged_in("global-ip", "associate", address, "--none")
    logged_in("global-ip", "release", address)
    assert address not in logged_in("global-ip", "list").stdout


def test_a_reader_sees_but_cannot_change(server, project, kumo_cli):
    reader = can_log_in(add_member(project, role=Role.READER))
    kumo_cli("login", server.url, "--username", reader.username, "--password", PASSWORD)
    kumo_cli("project", "use", project.slug)
    assert json.loads(kumo_cli("template", "list", "--json").stdout) is not None
    refused = kumo_cli("network", "create", "nope", ok=False)
    assert "403 permission_denied" in refused.stderr


# --- storage and billing ----------------------------------------------------------------------


def test_volumes(logged_in, project):
    from compute.choices import VmState
    from compute.models import VirtualMachine
    from tests.factories import make_host

    tenants.quota_set(project=project, storage_gib=100)
    made = json.loads(logged_in("volume", "create", "scratch", "--size", "10", "--json").stdout)
    assert (made["name"], made["size_gib"], made["state"]) == ("scratch", 10, "available")
    created = logged_in("volume", "create", "other", "--size", "5", "--tier", "local")
    assert "Volume other created: 5 GiB local" in created.stderr
    table = logged_in("volume", "list").stdout
    assert "scratch" in table and "available" in table

    logged_in("vm", "create", "disk-vm", "--template", make_template().name, "--image",
              str(make_image().pk))  # fmt: skip
    VirtualMachine.objects.filter(name="disk-vm").update(state=VmState.RUNNING, host=make_host())
    attached = logged_in("volume", "attach", "scratch", "disk-vm")
    assert "attached to VM disk-vm as vdb" in attached.stderr
    refused = logged_in("volume", "delete", "scratch", ok=False)
    assert refused.exit_code == 1 and "(409 in_use)" in refused.stderr and refused.stdout == ""
    extended = json.loads(logged_in("volume", "extend", "scratch", "--size", "20", "--json").stdout)
    assert extended["size_gib"] == 20
    [in_use] = json.loads(logged_in("volume", "list", "--state", "in_use", "--json").stdout)
    assert in_use["id"] == made["id"] and in_use["device"] == "vdb"
    assert "detached" in logged_in("volume", "detach", made["id"]).stderr
    logged_in("volume", "delete", "scratch")
    logged_in("volume", "delete", "other")
    assert json.loads(logged_in("volume", "list", "--json").stdout) == []
    missing = logged_in("volume", "delete", "scratch", ok=False)
    assert f"no volume 'scratch' in project {project.slug}" in missing.stderr


def test_buckets_and_access_keys(logged_in, project):
    tenants.quota_set(project=project, buckets=1)
    name = f"cli-{project.slug}"[:40]
    created = json.loads(logged_in("bucket", "create", name, "--quota", "3", "--json").stdout)
    assert (created["name"], created["quota_gib"]) == (name, 3)
    assert name in logged_in("bucket", "list").stdout
    over = logged_in("bucket", "create", f"{name}-2", "--quota", "1", ok=False)
    assert over.exit_code == 1 and "409 quota_exceeded" in over.stderr

    made = logged_in("access-key", "create", "--description", "laptop")
    secret = made.stdout.strip()
    assert secret and "shown only now" in made.stderr
    [key] = json.loads(logged_in("access-key", "list", "--json").stdout)
    assert key["description"] == "laptop" and "secret_access_key" not in key
    assert secret not in logged_in("access-key", "list").stdout
    logged_in("access-key", "delete", key["access_key_id"])
    assert json.loads(logged_in("access-key", "list", "--json").stdout) == []

    logged_in("bucket", "delete", name)
    assert json.loads(logged_in("bucket", "list", "--json").stdout) == []


def test_usage_forecast_and_invoices(logged_in, project, tmp_path):
    from tests.sdk.test_client import issue_invoice

    assert json.loads(logged_in("invoice", "list", "--json").stdout) == []
    assert "PERIOD" in logged_in("invoice", "list").stdout  # an empty table: its header
    assert json.loads(logged_in("usage", "--json").stdout) == []

    invoice = issue_invoice(project)
    records = json.loads(logged_in("usage", "--json").stdout)
    assert {r["subject_id"] for r in records} == {"train-1", "still-running"}
    [still] = json.loads(logged_in("usage", "--open", "--json").stdout)
    assert still["subject_id"] == "still-running"
    assert "open" in logged_in("usage", "--resource", "vcpu").stdout
    since = logged_in("usage", "--since", "2025-01-02T00:00:00", "--json").stdout
    assert [r["subject_id"] for r in json.loads(since)] == ["still-running"]

    forecast = json.loads(logged_in("usage", "--forecast", "--json").stdout)
    assert forecast["lines"] and float(forecast["projected"]) > 0
    assert "projected" in logged_in("usage", "--forecast").stdout

    [listed] = json.loads(logged_in("invoice", "list", "--json").stdout)
    assert listed["id"] == invoice.pk and listed["content_hash"] == invoice.content_hash
    assert "2025-01" in logged_in("invoice", "list").stdout
    document = logged_in("invoice", "download", str(invoice.pk), "--format", "json").stdout
    assert json.loads(document) == json.loads(invoice.document)
    target = tmp_path / "invoice.csv"
    wrote = logged_in("invoice", "download", str(invoice.pk), "-o", str(target))
    assert wrote.stdout == "" and str(target) in wrote.stderr
    assert "vcpu" in target.read_text()
    bad = logged_in("invoice", "download", str(invoice.pk), "--format", "pdf", ok=False)
    assert bad.exit_code == 2  # typer's usage error
    missing = logged_in("invoice", "download", str(invoice.pk + 1000), ok=False)
    assert missing.exit_code == 1 and "404" in missing.stderr


def test_subnet_dns_and_vm_rescue(server, hosts, logged_in, project):
    """`kumo subnet set-dns` and the rescue actions on a VM on a simulated host (libvirt's
    test driver: its console logs nowhere, so the log is empty)."""
    template, image = make_template(), make_image()
    logged_in("network", "create", "names", "--cidr", "10.31.0.0/24")
    [subnet] = json.loads(logged_in("subnet", "list", "--json").stdout)
    assert subnet["dns_servers"] == [] and "resolver" in logged_in("subnet", "list").stdout
    told = logged_in("subnet", "set-dns", "10.31.0.0/24", "--server", "9.9.9.9")
    assert "9.9.9.9" in told.stderr
    told = logged_in("subnet", "set-dns", str(subnet["id"]), "--default")
    assert "10.31.0.1" in told.stderr
    assert logged_in("subnet", "set-dns", str(subnet["id"]), ok=False).exit_code == 1

    logged_in(
        "vm", "create", "box", "--template", template.name, "--image", image.name,
        "--network", "names", "--wait", "--timeout", "90",
    )  # fmt: skip
    assert "succeeded" in logged_in("vm", "reset", "box", "--wait", "--timeout", "60").stderr
    assert logged_in("vm", "console-log", "box").exit_code == 0
    off = logged_in("vm", "power-off", "box", "--wait", "--timeout", "60")
    assert "succeeded" in off.stderr
    assert json.loads(logged_in("vm", "show", "box", "--json").stdout)["state"] == "stopped"
    refused = logged_in("vm", "reset", "box", ok=False)
    assert refused.exit_code == 1 and "stopped" in refused.stderr
