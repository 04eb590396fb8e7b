"""``kumo event`` end to end, through typer's CliRunner against a live Kumo: the project's
event feed newest first, narrowed by kind (on the API), object id and time, cut by
``--limit``; one event with its payload; another project's event not found."""

import json
import re
from datetime import UTC, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane import events
from controlplane.models import Event
from tenants import invitations
from tenants.billing.budgets import budget_create
from tests.factories import UserFactory, make_project, make_vm

pytestmark = pytest.mark.e2e


@pytest.fixture
def feed(logged_in, owner, project):
    """The project's events as ``controlplane.events.emit`` records them, oldest first: an
    eviction notice for VM a, three hours old; a member joining (an invitation accepted);
    a notice for VM b; a budget's threshold crossed. And one event of another project of
    the owner's (made after the login, which then chose the first project)."""
    vm_a, vm_b = make_vm(project, name="train-a"), make_vm(project, name="train-b")
    old = events.emit(
        "vm.eviction_notice",
        project=project,
        obj=vm_a,
        message="spot VM train-a is evicted in 120 s",
        payload={"vm": "train-a", "seconds": 120},
    )
    Event.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=3))
    invited = UserFactory(email="bob@example.org")
    _, secret = invitations.invitation_create(project=project, email=invited.email, actor=owner)
    membership = invitations.invitation_accept(secret=secret, user=invited)
    notice = events.emit(
        "vm.eviction_notice",
        project=project,
        obj=vm_b,
        message="spot VM train-b is evicted in 30 s",
        payload={"vm": "train-b", "seconds": 30},
    )
    budget = budget_create(project=project, name="monthly", amount=Decimal(100))
    threshold = events.emit(
        "budget.threshold",
        project=project,
        obj=budget,
        message="budget monthly: 80 % reached",
        payload={"budget": "monthly", "threshold": 80, "spent": "80.00"},
    )
    other = make_project(owner=owner)
    elsewhere = events.emit("vm.eviction_notice", project=other, message="not yours")
    joined = Event.objects.get(project=project, kind="member.joined")
    return {
        "old": old,
        "joined": joined,
        "notice": notice,
        "threshold": threshold,
        "elsewhere": elsewhere,
        "vm_a": vm_a,
        "vm_b": vm_b,
        "membership": membership,
        "other": other,
    }


def listed(cli, *args) -> list[int]:
    return [e["id"] for e in json.loads(cli("event", "list", *args, "--json").stdout)]


def ids(feed, *names) -> list[int]:
    return [feed[name].pk for name in names]


def test_list_is_the_projects_feed_newest_first(logged_in, feed, monkeypatch):
    assert listed(logged_in) == ids(feed, "threshold", "notice", "joined", "old")

    monkeypatch.setenv("COLUMNS", "250")  # one line per row
    lines = logged_in("event", "list").stdout.splitlines()
    assert lines[0].split() == ["TIME", "KIND", "OBJECT", "MESSAGE"]
    rows = [line.split() for line in lines[1:]]
    assert [row[2] for row in rows] == [
        "budget.threshold", "vm.eviction_notice", "member.joined", "vm.eviction_notice",
    ]  # fmt: skip
    vm_b, notice = feed["vm_b"], feed["notice"]
    assert rows[1] == [
        f"{notice.created_at.astimezone(UTC):%Y-%m-%d}",
        f"{notice.created_at.astimezone(UTC):%H:%M:%S}",
        "vm.eviction_notice",
        "compute.virtualmachine",
        str(vm_b.pk),
        *notice.message.split(),
    ]
    joined = feed["joined"]
    assert (joined.object_type, joined.object_id) == (
        "tenants.membership",
        str(feed["membership"].pk),
    )
    assert rows[2][3:5] == [joined.object_type, joined.object_id]
    assert "not yours" not in "\n".join(lines)


def test_kind_is_filtered_by_the_api_and_several_are_merged_newest_first(logged_in, feed):
    assert listed(logged_in, "--kind", "vm.eviction_notice") == ids(feed, "notice", "old")
    assert listed(logged_in, "--kind", "member.joined") == ids(feed, "joined")
    both = listed(logged_in, "--kind", "member.joined", "--kind", "vm.eviction_notice")
    assert both == ids(feed, "notice", "joined", "old")
    assert listed(logged_in, "--kind", "vm.eviction") == []  # exactly the kind, not a prefix


def test_an_unknown_kind_is_an_empty_table(logged_in, feed):
    shown = logged_in("event", "list", "--kind", "no.such.kind")
    assert shown.stdout.split() == ["TIME", "KIND", "OBJECT", "MESSAGE"] and shown.stderr == ""
    assert listed(logged_in, "--kind", "no.such.kind") == []


def test_object_id_narrows_to_one_objects_events(logged_in, feed):
    vm_a, vm_b = str(feed["vm_a"].pk), str(feed["vm_b"].pk)
    assert listed(logged_in, "--object-id", vm_a) == ids(feed, "old")
    assert listed(logged_in, "--object-id", vm_b) == ids(feed, "notice")
    assert listed(logged_in, "--object-id", vm_b, "--kind", "budget.threshold") == []
    assert listed(logged_in, "--object-id", "no-such-object") == []


def test_since_takes_a_time_or_an_age(logged_in, feed):
    newer = ids(feed, "threshold", "notice", "joined")
    assert listed(logged_in, "--since", "1h") == newer
    assert listed(logged_in, "--since", "4h") == [*newer, feed["old"].pk]
    at = feed["joined"].created_at.astimezone(UTC)
    assert listed(logged_in, "--since", at.isoformat()) == ids(
        feed, "threshold", "notice", "joined"
    )
    naive = (at + timedelta(microseconds=1)).replace(tzinfo=None).isoformat()  # read as UTC
    assert listed(logged_in, "--since", naive) == ids(feed, "threshold", "notice")
    assert listed(logged_in, "--since", "1h", "--kind", "vm.eviction_notice") == ids(feed, "notice")

    refused = logged_in("event", "list", "--since", "yesterday", ok=False)
    assert refused.exit_code == 2 and "neither an ISO 8601 time" in refused.stderr


def test_limit_keeps_the_newest(logged_in, feed):
    assert listed(logged_in, "--limit", "2") == ids(feed, "threshold", "notice")
    assert listed(logged_in, "--limit", "1", "--kind", "vm.eviction_notice") == ids(feed, "notice")
    assert listed(logged_in, "--limit", "1", "--object-id", str(feed["vm_a"].pk)) == ids(
        feed, "old"
    )
    assert logged_in("event", "list", "--limit", "0", ok=False).exit_code == 2


def test_show_prints_the_event_and_its_payload(logged_in, kumo, feed, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    threshold = feed["threshold"]
    shown = logged_in("event", "show", str(threshold.pk)).stdout
    fields = {
        name: value.strip()
        for name, value in (
            re.split(r"\s{2,}", line, maxsplit=1) for line in shown.splitlines() if line[:1].strip()
        )
    }
    assert fields["kind"] == "budget.threshold"
    assert fields["object"] == f"{threshold.object_type} {threshold.object_id}"
    assert threshold.object_type == "tenants.budget" and threshold.object_id
    assert fields["message"] == "budget monthly: 80 % reached"
    assert fields["payload"] == "{"
    payload = json.loads(shown[shown.index("{") :])
    assert payload == {"budget": "monthly", "threshold": 80, "spent": "80.00"}

    answer = json.loads(logged_in("event", "show", str(threshold.pk), "--json").stdout)
    assert answer == kumo.events.get(threshold.pk).raw
    assert answer["payload"] == payload and answer["created_at"]


def test_another_projects_event_is_not_found(logged_in, feed):
    elsewhere, other = feed["elsewhere"], feed["other"]
    refused = logged_in("event", "show", str(elsewhere.pk), ok=False)
    assert refused.exit_code == 1 and "404" in refused.stderr and refused.stdout == ""
    assert elsewhere.pk not in listed(logged_in)

    # The same id is the other project's event, which its owner reads there.
    there = logged_in("--project", other.slug, "event", "show", str(elsewhere.pk), "--json")
    assert json.loads(there.stdout)["message"] == "not yours"
