"""`kumo member invite`, `kumo invitation`, `kumo application`, `kumo user` and `kumo admin
reviewer` against a real server."""

import json
import re

from tenants import applications
from tenants.models import InstitutionReviewer, Membership, Project
from tests.factories import UserFactory, make_host
from tests.sdk.conftest import PASSWORD, can_log_in


def test_member_invite_answers_the_same_for_every_address(logged_in, project):
    known = UserFactory(email="known@uni.example.ac.jp")
    said = {}
    for email in (known.email, "nobody@uni.example.ac.jp"):
        done = logged_in("member", "invite", email, "--role", "reader")
        said[email] = re.sub(r"Invitation \d+ ", "Invitation N ", done.stderr).replace(email, "X")
    assert said[known.email] == said["nobody@uni.example.ac.jp"]
    assert "Invitation N sent to X as reader." in said[known.email]
    assert not Membership.objects.filter(project=project, user=known).exists()
    listed = json.loads(logged_in("invitation", "list", "--json").stdout)
    assert sorted((i["email"], i["status"]) for i in listed) == [
        (known.email, "pending"),
        ("nobody@uni.example.ac.jp", "pending"),
    ]
    gone = logged_in("member", "add", known.username, ok=False)  # no adding by name
    assert gone.exit_code == 2 and "No such command 'add'" in gone.output


def test_invite_and_apply(logged_in, project):
    made = logged_in("invitation", "create", "someone@uni.example.ac.jp", "--role", "reader")
    assert "sent to someone@uni.example.ac.jp" in made.stderr
    [inv] = json.loads(logged_in("invitation", "list", "--json").stdout)
    assert inv["status"] == "pending" and inv["role"] == "reader"
    logged_in("invitation", "revoke", str(inv["id"]))
    assert json.loads(logged_in("invitation", "list", "--json").stdout)[0]["status"] == "revoked"

    applied = logged_in(
        "application", "apply", "Deep sea genomes", "--purpose", "assemble genomes",
        "--slug", "deep-sea", "--gpus", "4", "--vcpus", "32",
    )  # fmt: skip
    assert "submitted" in applied.stderr
    [app] = json.loads(logged_in("application", "list", "--json").stdout)
    refused = logged_in("application", "review", str(app["id"]), "approve", ok=False)
    assert refused.exit_code == 1  # only operators review
    logged_in("application", "withdraw", str(app["id"]))
    assert not Project.objects.filter(slug="deep-sea").exists()


def test_operators_review_and_manage_users(server, kumo_cli, owner):
    operator = UserFactory(is_staff=True, is_superuser=True)
    can_log_in(operator)
    kumo_cli("login", server.url, "--username", operator.username, "--password", PASSWORD)
    kumo_cli(
        "application", "apply", "Own lab", "--purpose", "p", "--slug", "own-lab", "--gpus", "1"
    )
    [own] = json.loads(kumo_cli("application", "list", "--json").stdout)
    refused = kumo_cli("application", "review", str(own["id"]), "approve", ok=False)
    assert refused.exit_code == 1 and "your own application" in refused.output
    theirs = applications.application_submit(
        applicant=owner, slug="ops-lab", title="Ops lab", purpose="p", gpus=2
    )
    done = kumo_cli("application", "review", str(theirs.pk), "approve")
    assert "approved (project ops-lab)" in done.stderr
    assert Project.objects.get(slug="ops-lab").quota.gpus == 2
    listed = kumo_cli("user", "list", "--q", owner.username).stdout
    assert owner.username in listed
    kumo_cli("user", "deactivate", owner.username, "--reason", "left")
    owner.refresh_from_db()
    assert not owner.is_active
    kumo_cli("user", "reactivate", owner.username)
    owner.refresh_from_db()
    assert owner.is_active


def test_operators_designate_reviewers_who_then_review(server, kumo_cli, owner):
    issuer = "https://idp.x-univ.ac.jp/idp/shibboleth"
    operator = can_log_in(UserFactory(is_staff=True, is_superuser=True))
    reviewer = can_log_in(UserFactory())
    owner.external_identities.create(kind="saml", issuer=issuer, subject="owner@x-univ.ac.jp")
    kumo_cli("login", server.url, "--username", operator.username, "--password", PASSWORD)
    added = kumo_cli("admin", "reviewer", "add", reviewer.username, issuer)
    assert f"{reviewer.username} reviews applications of people of {issuer}" in added.stderr
    bad = kumo_cli("admin", "reviewer", "add", reviewer.username, "X University", ok=False)
    assert bad.exit_code == 1 and "issuer" in bad.output
    [row] = json.loads(kumo_cli("admin", "reviewer", "list", "--json").stdout)
    assert (row["user"], row["issuer"], row["created_by"]) == (
        reviewer.username,
        issuer,
        operator.username,
    )
    other = kumo_cli("admin", "reviewer", "list", "--issuer", "urn:other", "--json").stdout
    assert json.loads(other) == []

    theirs = applications.application_submit(
        applicant=owner, slug="x-lab", title="X lab", purpose="p", gpus=1
    )
    kumo_cli("login", server.url, "--username", reviewer.username, "--password", PASSWORD)
    [seen] = json.loads(kumo_cli("application", "list", "--json").stdout)
    assert seen["id"] == theirs.pk
    done = kumo_cli("application", "review", str(theirs.pk), "approve")
    assert "approved (project x-lab)" in done.stderr
    refused = kumo_cli("admin", "reviewer", "list", ok=False)  # reviewers are not operators
    assert refused.exit_code == 1

    kumo_cli("login", server.url, "--username", operator.username, "--password", PASSWORD)
    removed = kumo_cli("admin", "reviewer", "remove", reviewer.username, issuer)
    assert "no longer reviews" in removed.stderr
    assert not InstitutionReviewer.objects.exists()
    gone = kumo_cli("admin", "reviewer", "remove", reviewer.username, issuer, ok=False)
    assert gone.exit_code == 1


def test_an_operator_changes_a_projects_lease_from_the_cli(server, kumo_cli, project):
    from datetime import timedelta

    from django.utils import timezone

    from compute import services as compute
    from compute.models import Lease

    make_host()  # 8 GPUs
    start = timezone.now().replace(microsecond=0) + timedelta(hours=2)
    lease = compute.lease_create(
        project=project, name="run", gpus=2, starts_at=start, ends_at=start + timedelta(hours=1),
        gpu_model="A100-SXM4-40GB",
    )  # fmt: skip
    operator = can_log_in(UserFactory(is_staff=True, is_superuser=True))
    kumo_cli("login", server.url, "--username", operator.username, "--password", PASSWORD)
    kept = kumo_cli("admin", "lease-update", str(lease.pk), "--no-lend-idle")
    assert f"Lease {project.slug}/run keeps its idle GPUs for its VMs." in kept.stderr
    assert not Lease.objects.get(pk=lease.pk).lend_idle
    lent = json.loads(
        kumo_cli("admin", "lease-update", str(lease.pk), "--lend-idle", "--json").stdout
    )
    assert lent["lend_idle"] is True and Lease.objects.get(pk=lease.pk).lend_idle
    unsaid = kumo_cli("admin", "lease-update", str(lease.pk), ok=False)
    assert unsaid.exit_code != 0 and "--lend-idle or --no-lend-idle" in unsaid.stderr
    later = kumo_cli("admin", "lease-update", str(lease.pk), "--extend", "1.5")
    new_end = start + timedelta(hours=2.5)
    assert f"Lease {project.slug}/run ends at {new_end:%Y-%m-%d %H:%M} UTC." in later.stderr
    assert Lease.objects.get(pk=lease.pk).ends_at == new_end
    at = (start + timedelta(hours=2)).isoformat()
    assert kumo_cli("admin", "lease-update", str(lease.pk), "--ends", at).exit_code == 0
    assert Lease.objects.get(pk=lease.pk).ends_at == start + timedelta(hours=2)
