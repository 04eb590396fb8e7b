"""`kumo admin host guests`, `vm describe`, `invoice issue|download` and `image upload`
through typer's CliRunner against a live Kumo: an operator asks the simulated host's libvirt
for its guests and a VM's domain, issues a month's invoices and downloads one, uploads a
public image's file; bad input is a usage error naming the argument."""

import hashlib
import json
import re
import uuid
from datetime import UTC, datetime

import pytest
from kumo_sdk import Client

from compute.models import Image
from tenants import billing
from tenants.models import Invoice
from tests.factories import UserFactory, make_image, make_project, make_template, token_for
from tests.sdk.conftest import PASSWORD, can_log_in
from tests.tenants.test_billing_api import PRICES, used

pytestmark = pytest.mark.e2e


def log_in(kumo_cli, server, user):
    can_log_in(user)
    kumo_cli("login", server.url, "--username", user.username, "--password", PASSWORD)


@pytest.fixture
def operator(transactional_db):
    return UserFactory(is_staff=True)


def test_host_guests_and_vm_describe_ask_the_simulated_hosts_libvirt(
    server, hosts, owner, project, operator, kumo_cli
):
    template, image = make_template(), make_image()
    log_in(kumo_cli, server, owner)
    kumo_cli("project", "use", project.slug)
    created = kumo_cli(
        "vm", "create", "probe-1", "--template", template.name, "--image", image.name,
        "--wait", "--timeout", "90", "--json",
    )  # fmt: skip
    vm = json.loads(created.stdout)
    assert vm["state"] == "running" and vm["host"] == hosts[0]

    log_in(kumo_cli, server, operator)
    asked = kumo_cli("admin", "host", "guests", hosts[0])
    assert asked.stdout == ""
    said = re.search(r"Asked host cpu-01 for its guests: operation ([0-9a-f-]{36})", asked.stderr)
    assert said and f"kumo admin operation show {said[1]} --wait" in asked.stderr
    followed = kumo_cli("admin", "operation", "show", said[1], "--wait", "--json")
    answer = json.loads(followed.stdout)  # a host's operation: in no project
    assert (answer["id"], answer["kind"], answer["state"]) == (said[1], "host.guests", "succeeded")
    assert [g["vm_id"] for g in answer["result"]["guests"]] == [vm["id"]]
    shown = kumo_cli("admin", "operation", "show", said[1]).stdout
    assert "succeeded" in shown and vm["id"] in shown  # its result, the guests

    listed = kumo_cli("admin", "host", "guests", hosts[0], "--wait", "--timeout", "60")
    [row] = [line for line in listed.stdout.splitlines() if vm["id"] in line]
    assert row.split()[1:3] == ["probe-1", "running"]  # Kumo's name, libvirt's power
    assert f"Kumo guests in host {hosts[0]}'s libvirt: 1." in listed.stderr
    answer = json.loads(kumo_cli("admin", "host", "guests", hosts[0], "--wait", "--json").stdout)
    assert (answer["kind"], answer["state"]) == ("host.guests", "succeeded")
    assert [g["vm_id"] for g in answer["result"]["guests"]] == [vm["id"]]

    described = kumo_cli("admin", "vm", "describe", vm["id"], "--wait", "--timeout", "60")
    assert described.stdout.lstrip().startswith("<domain")
    assert vm["id"] in described.stdout
    assert f"VM {vm['id']} as libvirt holds it: running, generation" in described.stderr
    domain = json.loads(kumo_cli("admin", "vm", "describe", vm["id"], "--wait", "--json").stdout)
    assert domain["kind"] == "vm.describe" and domain["target_id"] == vm["id"]
    assert domain["result"]["domain_xml"].rstrip("\n") == described.stdout.rstrip("\n")

    missing = kumo_cli("admin", "vm", "describe", str(uuid.uuid4()), ok=False)
    assert missing.exit_code == 1 and "error:" in missing.stderr and "404" in missing.stderr


def test_invoice_issue_then_download(server, kumo_cli, project, operator, tmp_path):
    billing.rate_card_create(valid_from=datetime(2025, 1, 1, tzinfo=UTC), prices=PRICES)
    other = make_project()
    for each in (project, other):
        used(each, hours=10, start=datetime(2025, 1, 1, tzinfo=UTC))
    log_in(kumo_cli, server, operator)

    issued = kumo_cli("admin", "invoice", "issue", "2025-01-15", "--project", project.slug)
    invoice = Invoice.objects.get(project=project)
    [row] = [line for line in issued.stdout.splitlines() if project.slug in line]
    assert row.split()[:3] == [str(invoice.pk), project.slug, "2025-01"]
    assert not Invoice.objects.filter(project=other).exists()  # --project: only that one
    again = kumo_cli("admin", "invoice", "issue", "2025-01", "--project", project.slug)
    assert "No new invoice for 2025-01" in again.stderr
    assert Invoice.objects.filter(project=project).count() == 1
    [rest] = json.loads(kumo_cli("admin", "invoice", "issue", "2025-01", "--json").stdout)
    assert rest["project"] == other.slug and rest["period_start"] == "2025-01-01"

    csv = kumo_cli("admin", "invoice", "download", str(invoice.pk)).stdout
    assert csv == billing.invoice_csv(invoice.document)
    assert csv.startswith(f"# project,{project.slug},period,2025-01-01\n")
    assert any(line.startswith("vcpu,") for line in csv.splitlines())
    target = tmp_path / "invoice.json"
    wrote = kumo_cli(
        "admin", "invoice", "download", str(invoice.pk), "--format", "json", "-o", str(target)
    )
    assert wrote.stdout == "" and f"written to {target}" in wrote.stderr
    assert target.read_text() == invoice.document


def test_public_image_upload(server, kumo_cli, operator, tmp_path):
    with Client(server.url, token_for(operator), backoff=0) as kumo:
        made = kumo.admin.images.create("pub-debian", os_distro="debian", format="raw")
        other = kumo.admin.images.create("pub-other", os_distro="debian", format="raw")
    data = b"a public disk" * 40_000
    path = tmp_path / "disk.raw"
    path.write_bytes(data)
    checksum = "sha256:" + hashlib.sha256(data).hexdigest()
    log_in(kumo_cli, server, operator)

    done = kumo_cli("admin", "image", "upload", "pub-debian", str(path))
    assert done.stderr.strip() == (
        f"Image pub-debian is active: {len(data)} bytes, {checksum} (id {made.id})."
    )
    image = Image.objects.get(pk=made.id)
    assert (image.checksum, image.size_bytes, image.project) == (checksum, len(data), None)
    again = kumo_cli("admin", "image", "upload", str(made.id), str(path), ok=False)
    assert again.exit_code == 1 and "409" in again.stderr  # active: its file is final

    answer = json.loads(
        kumo_cli("admin", "image", "upload", str(other.id), str(path), "--json").stdout
    )
    assert (answer["state"], answer["checksum"]) == ("active", checksum)


def test_bad_input_is_a_usage_error_naming_it_and_only_operators_may(
    server, kumo_cli, owner, operator, tmp_path
):
    log_in(kumo_cli, server, operator)
    pdf = kumo_cli("admin", "invoice", "download", "1", "--format", "pdf", ok=False)
    assert pdf.exit_code == 2 and "'--format'" in pdf.stderr and "'pdf'" in pdf.stderr
    month = kumo_cli("admin", "invoice", "issue", "2025-13", ok=False)
    assert month.exit_code == 2 and "Invalid value for PERIOD" in month.stderr
    nothing = kumo_cli("admin", "image", "upload", "7", str(tmp_path / "none.raw"), ok=False)
    assert nothing.exit_code == 2 and "Invalid value for FILE" in nothing.stderr

    log_in(kumo_cli, server, owner)
    refused = kumo_cli("admin", "invoice", "issue", "2025-01", ok=False)
    assert refused.exit_code == 1 and "403" in refused.stderr
