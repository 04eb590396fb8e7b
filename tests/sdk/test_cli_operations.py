"""``kumo operation`` end to end, through typer's CliRunner against a live Kumo: the
project's operations (made by ``kumo vm create`` and ``kumo vm delete``, with no host to
place the VMs) newest first, narrowed by state and cut by ``--limit``; one operation shown;
``--wait`` on a finished, a failed, an unfinished one and one that fails while it polls;
another project's operation not found."""

import json
import re
from datetime import UTC

import pytest
from kumo_sdk.resources.operations import Operations

from compute.models import VirtualMachine
from compute.services.vms import vm_delete
from controlplane.choices import OperationState
from controlplane.models import Operation
from tenants import services as tenants
from tests.factories import make_image, make_project, make_template, make_vm

pytestmark = pytest.mark.e2e

DELETED_UNPLACED = "the VM was deleted before it was placed"


@pytest.fixture
def work(logged_in, owner, project):
    """Three operations of the project, oldest first: web-1's create, failed when web-1 was
    deleted before any host placed it; that delete, succeeded at once; web-2's create, still
    pending (no host runs). And a pending create in another project of the owner's (made
    after the login, which then chose the first project)."""
    template, image = make_template(), make_image()
    create = ("--template", template.name, "--image", str(image.pk))
    logged_in("vm", "create", "web-1", *create)
    logged_in("vm", "delete", "web-1")
    logged_in("vm", "create", "web-2", *create)
    ops = {(o.kind, o.state): o for o in Operation.objects.filter(project=project)}
    assert len(ops) == 3
    other = make_project(owner=owner)
    tenants.quota_set(project=other, vcpus=64, memory_gib=256, vms=10)
    make_vm(other, template=template, image=image)
    return {
        "failed": ops["vm.create", OperationState.FAILED],
        "deleted": ops["vm.delete", OperationState.SUCCEEDED],
        "pending": ops["vm.create", OperationState.PENDING],
        "elsewhere": Operation.objects.get(project=other),
        "other": other,
    }


def listed(cli, *args) -> list[str]:
    return [o["id"] for o in json.loads(cli("operation", "list", *args, "--json").stdout)]


def ids(work, *names) -> list[str]:
    return [str(work[name].pk) for name in names]


def when(at) -> list[str]:
    return [f"{at.astimezone(UTC):%Y-%m-%d}", f"{at.astimezone(UTC):%H:%M:%S}"]


def fields_of(shown: str) -> dict[str, str]:
    return {
        name: value.strip()
        for name, value in (
            re.split(r"\s{2,}", line, maxsplit=1) for line in shown.splitlines() if line[:1].strip()
        )
    }


def test_list_is_the_projects_operations_newest_first(logged_in, kumo, work, monkeypatch):
    assert listed(logged_in) == ids(work, "pending", "deleted", "failed")
    answer = json.loads(logged_in("operation", "list", "--json").stdout)
    assert answer == [o.raw for o in kumo.operations.list()]

    monkeypatch.setenv("COLUMNS", "250")  # one line per row, however wide the ids
    lines = logged_in("operation", "list").stdout.splitlines()
    assert lines[0].split() == ["ID", "KIND", "STATE", "OBJECT", "CREATED", "FINISHED", "ERROR"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == ids(work, "pending", "deleted", "failed")
    failed, pending = work["failed"], work["pending"]
    assert rows[str(failed.pk)] == [
        str(failed.pk), "vm.create", "failed", "compute.virtualmachine", failed.target_id,
        *when(failed.created_at), *when(failed.finished_at), *DELETED_UNPLACED.split(),
    ]  # fmt: skip
    assert rows[str(pending.pk)] == [
        str(pending.pk), "vm.create", "pending", "compute.virtualmachine", pending.target_id,
        *when(pending.created_at), "-", "-",
    ]  # fmt: skip
    assert str(work["elsewhere"].pk) not in "\n".join(lines)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("failed", ["failed"]),
        ("succeeded", ["deleted"]),
        ("pending", ["pending"]),
        ("running", []),
    ],
)
def test_state_is_filtered_by_the_api(logged_in, work, state, expected):
    assert listed(logged_in, "--state", state) == ids(work, *expected)


def test_an_unknown_state_is_the_apis_refusal(logged_in, work):
    refused = logged_in("operation", "list", "--state", "done", ok=False)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert "400 invalid" in refused.stderr and "state" in refused.stderr


def test_limit_keeps_the_newest(logged_in, work):
    assert listed(logged_in, "--limit", "2") == ids(work, "pending", "deleted")
    assert listed(logged_in, "--limit", "1", "--state", "failed") == ids(work, "failed")
    assert logged_in("operation", "list", "--limit", "0", ok=False).exit_code == 2


def test_show_prints_the_operation(logged_in, kumo, work, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    failed = work["failed"]
    shown = fields_of(logged_in("operation", "show", str(failed.pk)).stdout)
    assert (shown["id"], shown["kind"], shown["state"]) == (str(failed.pk), "vm.create", "failed")
    assert shown["object"] == f"compute.virtualmachine {failed.target_id}"
    assert shown["error"] == DELETED_UNPLACED and shown["error code"] == "deleted"
    assert shown["finished"] == " ".join(when(failed.finished_at))

    answer = json.loads(logged_in("operation", "show", str(failed.pk), "--json").stdout)
    assert answer == kumo.operations.get(str(failed.pk)).raw
    assert (answer["state"], answer["error_message"]) == ("failed", DELETED_UNPLACED)


def test_another_projects_operation_is_not_found(logged_in, work):
    elsewhere, other = work["elsewhere"], work["other"]
    for args in ((), ("--wait",)):
        refused = logged_in("operation", "show", str(elsewhere.pk), *args, ok=False)
        assert refused.exit_code == 1 and "404" in refused.stderr and refused.stdout == ""

    # The same id is the other project's operation, which its owner reads there.
    there = logged_in("--project", other.slug, "operation", "show", str(elsewhere.pk), "--json")
    assert json.loads(there.stdout)["id"] == str(elsewhere.pk)


def test_wait_on_a_finished_operation_returns_at_once(logged_in, work):
    deleted = str(work["deleted"].pk)
    # A timeout no poll can outlast: only an answer read finished on the first poll passes.
    done = logged_in("operation", "show", deleted, "--wait", "--timeout", "0.001")
    assert fields_of(done.stdout)["state"] == "succeeded"

    pending = str(work["pending"].pk)
    unfinished = logged_in("operation", "show", pending, "--wait", "--timeout", "0.001", ok=False)
    assert unfinished.exit_code == 1 and unfinished.stdout == ""
    assert f"operation vm.create {pending} still pending after 0.001 s" in unfinished.stderr


def test_wait_on_a_failed_operation_exits_1_with_its_error(logged_in, work):
    failed = str(work["failed"].pk)
    refused = logged_in("operation", "show", failed, "--wait", ok=False)
    assert refused.exit_code == 1
    assert f"operation vm.create {failed} failed: {DELETED_UNPLACED}" in refused.stderr
    assert fields_of(refused.stdout)["state"] == "failed"  # shown, then the error

    as_json = logged_in("operation", "show", failed, "--wait", "--json", ok=False)
    assert as_json.exit_code == 1 and f"failed: {DELETED_UNPLACED}" in as_json.stderr
    assert json.loads(as_json.stdout)["error_message"] == DELETED_UNPLACED


def test_wait_polls_until_the_operation_fails(logged_in, project, work, monkeypatch):
    """web-2's create is pending at the first poll; web-2 is then deleted (the service the
    API calls), which fails it, and a later poll reads that."""
    seen = []
    real_get = Operations.get

    def get(self, operation, *, project=None):
        current = real_get(self, operation, project=project)
        seen.append(current.state)
        if len(seen) == 1:
            vm_delete(vm=VirtualMachine.objects.get(project=work["pending"].project, name="web-2"))
        return current

    monkeypatch.setattr(Operations, "get", get)
    pending = str(work["pending"].pk)
    refused = logged_in("operation", "show", pending, "--wait", "--timeout", "30", ok=False)
    assert refused.exit_code == 1
    assert f"operation vm.create {pending} failed: {DELETED_UNPLACED}" in refused.stderr
    assert seen[0] == "pending" and seen[-1] == "failed"
