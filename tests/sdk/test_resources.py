"""The SDK's and the CLI's newer collections against a live Kumo: SSH keys (`kumo ssh-key
add`, so a CLI-only user can register the key `vm create` needs), members, quota, placement
groups, budgets, webhooks, points, events and the audit trail, external connections, and the
operators' hosts, devices, rate cards, guarantees, points and institutional reviewers."""

import json
from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from kumo_sdk import Client, Conflict, InvalidInput, NotFound, PermissionDenied
from kumo_sdk.errors import NotSupported

from tenants import invitations
from tenants.choices import Role
from tests.factories import UserFactory, add_member, make_host, token_for
from tests.tenants.test_sshkeys import _openssh_public

pytestmark = pytest.mark.e2e


@pytest.fixture
def staff(server, transactional_db):
    user = UserFactory(is_staff=True)
    with Client(server.url, token_for(user), backoff=0) as client:
        yield client


def test_ssh_key_add_list_delete_from_the_cli(logged_in, tmp_path):
    public = tmp_path / "id_ed25519.pub"
    public.write_text(_openssh_public(ed25519.Ed25519PrivateKey.generate(), "me@laptop") + "\n")
    added = logged_in("ssh-key", "add", "laptop", str(public))
    assert "SSH key laptop added: ssh-ed25519 256 bits, SHA256:" in added.stderr
    [key] = json.loads(logged_in("ssh-key", "list", "--json").stdout)
    assert key["name"] == "laptop" and key["comment"] == "me@laptop"
    assert "laptop" in logged_in("ssh-key", "list").stdout

    bad = tmp_path / "bad.pub"
    bad.write_text("ssh-ed25519 AAAA$$$not*base64\n")
    refused = logged_in("ssh-key", "add", "broken", str(bad), ok=False)
    assert refused.exit_code == 1 and "(400 invalid)" in refused.stderr

    logged_in("ssh-key", "delete", "laptop")
    assert json.loads(logged_in("ssh-key", "list", "--json").stdout) == []


def test_members_come_by_invitation_quota_placement_groups(server, kumo, project, owner):
    other = UserFactory()
    with pytest.raises(NotSupported):  # no adding by name: people are invited
        kumo.members.create(other.email, role="reader")
    invited = kumo.invitations.create(other.email, role="reader")
    assert (invited.email, invited.role, invited.status) == (other.email, "reader", "pending")
    kumo.invitations.revoke(invited.id)
    assert kumo.invitations.get(invited.id).status == "revoked"
    # the secret travels only in the mail: made here as the mail would carry it
    _invitation, secret = invitations.invitation_create(
        project=project, email=other.email, role="reader", actor=owner
    )
    with Client(server.url, token_for(other), backoff=0) as invitee:
        assert invitee.invitations.accept(secret) == {"project": project.slug, "role": "reader"}
    assert kumo.members.get(other.username).role == "reader"
    assert kumo.members.update(other.username, role="member").role == "member"
    assert {m.user.username for m in kumo.members.list()} == {owner.username, other.username}
    kumo.members.delete(other.username)
    with pytest.raises(NotFound):
        kumo.members.get(other.username)

    quota = kumo.quota.get()
    assert (quota.vcpus.limit, quota.vcpus.used, quota.vcpus.available) == (64, 0, 64)
    assert quota.networks.limit == 10

    group = kumo.placement_groups.create("ring", policy="anti_affinity")
    assert kumo.placement_groups.find("ring").id == group.id
    kumo.placement_groups.delete(group.id)
    assert list(kumo.placement_groups.list()) == []
    with pytest.raises(NotSupported):
        kumo.placement_groups.update(group.id, name="x")


def test_budgets_webhooks_points_events_and_audit(kumo, project):
    budget = kumo.budgets.create("monthly", amount="100.00", thresholds=[50, 100], policy="notify")
    assert (Decimal(budget.amount), budget.thresholds) == (Decimal(100), [50, 100])
    assert kumo.budgets.update(budget.id, active=False).active is False
    with pytest.raises(InvalidInput) as refused:
        kumo.budgets.create("bad", amount="-1")
    assert "amount" in refused.value.fields
    kumo.budgets.delete(budget.id)

    hook = kumo.webhooks.create("https://hooks.kumo.invalid/hook", kinds=["vm.state"])
    assert hook.secret and hook.kinds == ["vm.state"]
    listed = kumo.webhooks.get(hook.id)
    assert listed.secret is None and listed.url == "https://hooks.kumo.invalid/hook"
    kumo.webhooks.delete(hook.id)

    assert list(kumo.points.list()) == []
    actions = {e.action for e in kumo.audit_events.list()}
    assert {"budget.create", "webhook.create"} <= actions, actions
    list(kumo.events.list())  # readable by a member; what it holds is the events tests' part


def test_external_connection_request(kumo, project):
    network = kumo.networks.create("lab", cidr="10.30.0.0/24")
    made = kumo.external_connections.create(
        "to-campus", kind="l3_route", network=network.name,
        destination_cidr="192.0.2.0/24", next_hop="10.30.0.254",
    )  # fmt: skip
    assert made.state == "requested" and made.destination_cidr == "192.0.2.0/24"
    assert [c.id for c in kumo.external_connections.list()] == [made.id]
    kumo.external_connections.delete(made.id)


def test_operators_hosts_devices_rate_cards_guarantees_points(staff, kumo, project):
    host = make_host()
    [listed] = [h for h in staff.admin.hosts.list() if h.name == host.name]
    assert listed.gpus == 8 and listed.state == "up"
    drained = staff.admin.hosts.set_state(host.name, "draining", reason="bios update")
    assert (drained.state, drained.state_reason) == ("draining", "bios update")
    assert staff.admin.hosts.update(host.name, rack="r12").rack == "r12"
    devices = list(staff.admin.devices.list(host=host.name))
    assert sum(d.kind == "gpu" for d in devices) == 8

    card = staff.admin.rate_cards.create(
        valid_from="2020-01-01T00:00:00Z", currency="JPY",
        prices=[
            {"resource": r, "unit_price": p}
            for r, p in [("vcpu", "2"), ("memory", "0.5"), ("gpu", "300"), ("storage", "10"),
                         ("global_ip", "1")]
        ],
    )  # fmt: skip
    [gpu] = [p for p in card.prices if p.resource == "gpu"]
    assert Decimal(gpu.unit_price) == 300 and gpu.model == ""
    assert staff.admin.rate_cards.get(card.id).version == card.version

    guarantee = staff.admin.capacity_guarantees.update(project.slug, min_gpus=2)
    assert (guarantee.project, guarantee.min_gpus) == (project.slug, 2)
    assert kumo.reclamation.get().min_gpus == 2

    granted = staff.admin.points.create(project=project.slug, amount="50", note="welcome")
    assert Decimal(granted.balance_after) == 50
    [entry] = kumo.points.list()
    assert Decimal(entry.amount) == 50

    limits = staff.admin.projects.set_quota(project.slug, gpus=4)
    assert limits.gpus.limit == 4 and kumo.quota.get().gpus.limit == 4
    with pytest.raises(PermissionDenied):
        list(kumo.admin.hosts.list())


def test_operators_designate_and_remove_institutional_reviewers(staff, kumo, owner):
    issuer = "https://idp.x-univ.ac.jp/idp/shibboleth"
    reviewers = staff.admin.institution_reviewers
    row = reviewers.create(owner.username, issuer)
    assert (row.user, row.issuer) == (owner.username, issuer)
    with pytest.raises(Conflict):
        reviewers.create(owner.username, issuer)
    with pytest.raises(InvalidInput) as bad:
        reviewers.create(owner.username, "X University")
    assert "issuer" in bad.value.details
    assert [r.id for r in reviewers.list(user=owner.username)] == [row.id]
    assert list(reviewers.list(issuer="urn:other")) == []
    assert reviewers.get(row.id).issuer == issuer
    with pytest.raises(PermissionDenied):
        list(kumo.admin.institution_reviewers.list())
    assert reviewers.remove(owner.username, issuer).id == row.id
    with pytest.raises(NotFound):
        reviewers.remove(owner.username, issuer)


def test_shares_answer_conflict_without_a_tier(kumo):
    with pytest.raises(Conflict):
        kumo.shares.create("data", tier="fast", quota_gib=10)


def test_a_token_scoped_to_a_project(kumo, project):
    made = kumo.tokens.create("ci", project=project.slug)
    assert made.project == project.slug and made.token.startswith("kumo_")
    [listed] = [t for t in kumo.tokens.list() if t.id == made.id]
    assert listed.project == project.slug and listed.token is None


def test_cli_members_quota_groups_budgets_webhooks_points_connections(logged_in, project):
    other = add_member(project, role=Role.READER)  # as accepting an invitation makes them
    logged_in("member", "set-role", other.username, "member")
    members = json.loads(logged_in("member", "list", "--json").stdout)
    assert {m["user"]["username"]: m["role"] for m in members}[other.username] == "member"
    logged_in("member", "remove", other.username)

    quota = json.loads(logged_in("quota", "--json").stdout)
    assert quota["vcpus"] == {"limit": 64, "used": 0, "available": 64}
    assert "vcpus" in logged_in("quota").stdout

    logged_in("placement-group", "create", "ring", "--policy", "compact")
    assert "compact" in logged_in("placement-group", "list").stdout
    logged_in("placement-group", "delete", "ring")

    made = logged_in("budget", "create", "monthly", "--amount", "250", "--threshold", "80",
                     "--policy", "stop_spot", "--json")  # fmt: skip
    budget = json.loads(made.stdout)
    assert budget["thresholds"] == [80] and budget["policy"] == "stop_spot"
    assert "monthly" in logged_in("budget", "list").stdout
    logged_in("budget", "delete", str(budget["id"]))

    hook = logged_in(
        "webhook", "create", "https://hooks.kumo.invalid/cli-hook", "--kind", "vm.state"
    )
    assert "shown only now" in hook.stderr and hook.stdout.strip()
    [listed] = json.loads(logged_in("webhook", "list", "--json").stdout)
    assert listed["kinds"] == ["vm.state"] and "secret" not in listed

    assert json.loads(logged_in("points", "--json").stdout) == []

    logged_in("network", "create", "lab", "--cidr", "10.40.0.0/24")
    asked = logged_in("external-connection", "request", "campus", "--kind", "l3_route",
                      "--network", "lab", "--destination-cidr", "192.0.2.0/24",
                      "--next-hop", "10.40.0.254")  # fmt: skip
    assert "is requested" in asked.stderr
    refused = logged_in("share", "create", "data", "--quota", "10", ok=False)
    assert refused.exit_code == 1 and "(409" in refused.stderr


def test_leases_from_the_sdk_and_the_cli(staff, kumo, project, logged_in):
    from datetime import UTC, datetime, timedelta

    make_host()  # 8 GPUs
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    lease = kumo.leases.create("run", gpus=6, starts_at=start, ends_at=start + timedelta(hours=2))
    assert (lease.name, lease.gpus, lease.state, lease.project, lease.lend_idle) == (
        "run",
        6,
        "scheduled",
        project.slug,
        True,
    )
    with pytest.raises(Conflict) as refused:
        kumo.leases.create("more", gpus=4, starts_at=start, ends_at=start + timedelta(hours=1))
    assert refused.value.details["earliest_starts_at"] == [(start + timedelta(hours=2)).isoformat()]
    with pytest.raises(InvalidInput) as bad:
        kumo.leases.create("bad", gpus=0, starts_at=start, ends_at=start)
    assert "gpus" in bad.value.details
    # Its end moved later: admitted again for the time it adds, up to the next lease.
    hour = timedelta(hours=1)
    kumo.leases.create("then", gpus=4, starts_at=start + 3 * hour, ends_at=start + 4 * hour)
    with pytest.raises(Conflict) as refused:
        kumo.leases.update(lease.id, ends_at=start + 4 * hour)
    assert refused.value.details["latest_ends_at"] == [(start + 3 * hour).isoformat()]
    assert kumo.leases.update(lease.id, ends_at=start + 3 * hour).ends_at == start + 3 * hour
    with pytest.raises(InvalidInput) as bad:
        kumo.leases.update(lease.id, ends_at="soon")
    assert "ends_at" in bad.value.details
    calendar = staff.admin.leases.list(project=project.slug)
    assert {x.name for x in calendar} == {"run", "then"}
    moved = staff.admin.leases.update(lease.id, ends_at=start + 2 * hour)
    assert moved.ends_at == start + 2 * hour
    assert kumo.leases.update(lease.id, gpus=7).gpus == 7
    with pytest.raises(InvalidInput) as bad:
        kumo.leases.update(lease.id, gpus=0)
    assert "gpus" in bad.value.details
    assert kumo.leases.update(lease.id, gpus=6).gpus == 6
    # Operators change any project's lending; members cannot through the operators' path.
    assert not staff.admin.leases.update(lease.id, lend_idle=False).lend_idle
    assert staff.admin.leases.update(lease.id, lend_idle=True).lend_idle
    with pytest.raises(PermissionDenied):
        kumo.admin.leases.update(lease.id, lend_idle=False)

    logged_in("project", "use", project.slug)
    listed = logged_in("lease", "list").stdout
    assert "run" in listed and "6 x A100-SXM4-40GB" in listed and "scheduled" in listed
    made = logged_in("lease", "create", "later", "--gpus", "2", "--start", "now", "--hours", "1",
                     "--no-lend-idle")  # fmt: skip
    assert "Lease later: 2 x A100-SXM4-40GB" in made.stderr
    assert not kumo.leases.find("later").lend_idle
    lent = logged_in("lease", "update", "later", "--lend-idle")
    assert "Lease later lends its idle GPUs to spot VMs." in lent.stderr
    assert kumo.leases.find("later").lend_idle
    ends = kumo.leases.find("later").ends_at
    moved = logged_in("lease", "update", "later", "--extend", "2")
    assert f"Lease later ends at {ends + 2 * hour:%Y-%m-%d %H:%M} UTC." in moved.stderr
    assert kumo.leases.find("later").ends_at == ends + 2 * hour
    later = kumo.leases.find("later")
    soon = (later.starts_at + 0.5 * hour).isoformat()
    moved = logged_in("lease", "update", "later", "--start", soon)
    after = kumo.leases.find("later")
    assert after.starts_at == later.starts_at + 0.5 * hour  # it keeps its length
    assert after.ends_at == later.ends_at + 0.5 * hour
    assert f"Lease later runs from {after.starts_at:%Y-%m-%d %H:%M}" in moved.stderr
    grown = logged_in("lease", "update", "later", "--gpus", "1")
    assert "Lease later holds 1 x A100-SXM4-40GB." in grown.stderr
    both = logged_in("lease", "update", "later", "--extend", "1", "--ends", "now", ok=False)
    assert both.exit_code != 0 and "--ends or --extend, not both" in both.stderr
    assert not kumo.leases.update(lease.id, lend_idle=False).lend_idle
    with pytest.raises(InvalidInput) as bad:
        kumo.leases.update(lease.id, lend_idle="maybe")
    assert "lend_idle" in bad.value.details
    unsaid = logged_in("lease", "update", "later", ok=False)
    assert unsaid.exit_code != 0 and "--lend-idle or --no-lend-idle" in unsaid.stderr
    assert "is cancelled" in logged_in("lease", "cancel", "later").stderr
    assert kumo.leases.cancel(lease.id).state == "cancelled"
    with pytest.raises(Conflict) as ended:
        kumo.leases.update(lease.id, lend_idle=True)
    assert ended.value.code == "lease_ended" and ended.value.details == {"state": ["cancelled"]}
    # Whole hosts: every GPU of each.
    whole = kumo.leases.create("node", hosts=1, starts_at=start, ends_at=start + timedelta(hours=1))
    assert (whole.hosts, whole.gpus) == (1, 8)
    made = logged_in("lease", "create", "now", "--hosts", "1", "--start", "now", "--hours", "1")
    assert "Lease now: 1 hosts (8 x A100-SXM4-40GB)" in made.stderr
    both = logged_in("lease", "create", "x", "--gpus", "1", "--hosts", "1", "--start", "now",
                     "--hours", "1", ok=False)  # fmt: skip
    assert both.exit_code == 1 and "(400" in both.stderr and "gpus" in both.stderr
