"""Shares through the services and the agent's ``apply_share``, and the usage billing
reads (``storage.selectors.gib_hours``)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from compute.services.lifecycle import apply_message
from controlplane.errors import Conflict
from storage import protocol, services
from storage.drivers.fake import FakeShareDriver
from storage.host_tasks import apply_share
from storage.models import Share, StorageUsage
from storage.selectors import gib_hours
from tests.factories import make_host, make_vm

pytestmark = pytest.mark.django_db
TIERS = {
    "fast": {"backend": "lustre", "host": "mds-01", "source": "10.0.0.1@o2ib:/fast"},
    "large": {"backend": "nfs", "host": "mds-01", "source": "nfs.example:/srv/kumo/exports"},
}


@pytest.fixture(autouse=True)
def tiers(settings, db):
    settings.SHARE_TIERS = TIERS
    return make_host("mds-01", kind="cpu")


def test_a_share_gets_a_project_id_a_mount_and_is_sent_to_its_host(project, monkeypatch):
    sent = []
    monkeypatch.setattr(
        "controlplane.agents.send_to_host", lambda host, task, **kw: sent.append((host, task, kw))
    )
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=100)
    other = services.share_create(project=project, name="bulk", tier="large", quota_gib=10)
    assert other.project_number == share.project_number + 1
    assert share.mount_source == f"10.0.0.1@o2ib:/fast/{share.directory}"
    assert share.mount_point == "/fast/data"
    host, task, wire = sent[0]
    assert (host, task) == ("mds-01", protocol.SHARE_APPLY_TASK)
    assert wire["quota_gib"] == 100 and wire["project_number"] == share.project_number


def test_an_unoffered_tier_is_409(project, settings):
    settings.SHARE_TIERS = {}
    with pytest.raises(Conflict) as refused:
        services.share_create(project=project, name="data", tier="fast", quota_gib=1)
    assert refused.value.code == "share_unavailable"


def test_the_host_applies_reports_and_guests_mount_it_once_applied(project):
    driver = FakeShareDriver()
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=100)
    vm = make_vm(project)
    assert apply_message(vm).mounts == ()
    message = protocol.ShareApply(
        share_id=str(share.pk),
        generation=share.generation,
        tier="fast",
        name=share.directory,
        project_number=share.project_number,
        quota_gib=100,
    )
    report = apply_share(message, drivers=lambda tier: driver)
    services.share_reported(host="mds-01", payload=report, sent_at=timezone.now())
    share.refresh_from_db()
    assert share.ready and share.used_bytes == 0 and share.last_error == ""
    (mount,) = apply_message(vm).mounts
    assert (mount.source, mount.mount_point, mount.fstype) == (
        share.mount_source,
        "/fast/data",
        "lustre",
    )
    stale = apply_share(
        protocol.ShareApply(**{**message.to_wire(), "generation": 0}), drivers=lambda tier: driver
    )
    assert stale["stale"] is True and stale["generation"] == share.generation


def test_a_failed_apply_is_recorded_and_not_ready(project, caplog):
    driver = FakeShareDriver()
    driver.fail_next = "lfs setquota: Operation not permitted"
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=1)
    report = apply_share(
        protocol.ShareApply(
            share_id=str(share.pk),
            generation=share.generation,
            tier="fast",
            name=share.directory,
            project_number=share.project_number,
            quota_gib=1,
        ),
        drivers=lambda tier: driver,
    )
    caplog.set_level("WARNING", logger="storage.services")
    services.share_reported(host="mds-01", payload=report, sent_at=timezone.now())
    share.refresh_from_db()
    # The project is told it failed; the host's words go to the operators' log only.
    assert not share.ready and "operators have been told" in share.last_error
    assert "not permitted" not in share.last_error
    assert any("not permitted" in r.getMessage() for r in caplog.records)


def test_a_tier_no_host_serves_names_no_operator_setting_to_the_project(
    project, monkeypatch, caplog
):
    """Issue 13, item 12: the share error a tenant sees never names KUMO_SHARES."""
    monkeypatch.delenv("KUMO_SHARES", raising=False)
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=1)
    report = apply_share(
        protocol.ShareApply(
            share_id=str(share.pk),
            generation=share.generation,
            tier="fast",
            name=share.directory,
            project_number=share.project_number,
            quota_gib=1,
        )
    )
    caplog.set_level("WARNING", logger="storage.services")
    services.share_reported(host="mds-01", payload=report, sent_at=timezone.now())
    share.refresh_from_db()
    assert share.last_error and "KUMO_" not in share.last_error
    assert any("KUMO_SHARES" in r.getMessage() for r in caplog.records)


def test_extend_bumps_the_generation_and_delete_forgets_it(project):
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=10)
    share = services.share_extend(share=share, quota_gib=20)
    assert (share.quota_gib, share.generation) == (20, 2)
    services.share_delete(share=share)
    assert not Share.objects.exists()


def test_gib_hours_clip_intervals_to_the_period(project, other_project):
    start = timezone.now().replace(microsecond=0) - timedelta(hours=10)
    end = start + timedelta(hours=10)
    rows = [
        (project, "volume", "v1", "10", start - timedelta(hours=5), start + timedelta(hours=2)),
        (project, "volume", "v1", "20", start + timedelta(hours=2), None),
        (project, "bucket", "b1", "1.5", start + timedelta(hours=4), start + timedelta(hours=6)),
        (other_project, "share", "s1", "100", end + timedelta(hours=1), None),
    ]
    for p, kind, object_id, gib, since, until in rows:
        StorageUsage.objects.create(
            project=p, kind=kind, object_id=object_id, gib=gib, started_at=since, ended_at=until
        )
    assert gib_hours(start, end) == {
        project.pk: {"volume": Decimal("180.000"), "bucket": Decimal("3.000")}
    }
    assert gib_hours(start, end, project=other_project) == {}


def test_a_share_is_sent_to_exactly_its_projects_vm_addresses_as_they_come_and_go(
    project, other_project, monkeypatch, django_capture_on_commit_callbacks
):
    from compute import services as compute
    from tests.compute.test_vms import fresh, report
    from tests.factories import make_network

    sent = []

    def send_to_host(host, task, **kw):
        if task == protocol.SHARE_APPLY_TASK:
            sent.append(kw)

    monkeypatch.setattr("controlplane.agents.send_to_host", send_to_host)
    share = services.share_create(project=project, name="data", tier="large", quota_gib=1)
    assert list(sent[-1]["clients"]) == []  # no VM yet: exported to nobody
    make_host("gpu-01")
    net = make_network(project, cidr="10.9.0.0/24")
    with django_capture_on_commit_callbacks(execute=True):
        vm = make_vm(project, nics=[{"network": net, "fixed_ip": "10.9.0.10"}])
    assert list(sent[-1]["clients"]) == ["10.9.0.10"] and sent[-1]["share_id"] == str(share.pk)
    with django_capture_on_commit_callbacks(execute=True):
        make_vm(project, nics=[{"network": net, "fixed_ip": "10.9.0.11"}])
    assert list(sent[-1]["clients"]) == ["10.9.0.10", "10.9.0.11"]

    # Another project's network overlaps: its VM at 10.9.0.11 makes that address name
    # no one project, so neither project's share is exported to it.
    theirs = services.share_create(project=other_project, name="data", tier="large", quota_gib=1)
    other_net = make_network(other_project, cidr="10.9.0.0/24")
    with django_capture_on_commit_callbacks(execute=True):
        make_vm(other_project, nics=[{"network": other_net, "fixed_ip": "10.9.0.11"}])
    by_share = {kw["share_id"]: list(kw["clients"]) for kw in sent}
    assert by_share[str(theirs.pk)] == []
    assert by_share[str(share.pk)] == ["10.9.0.10"]

    # The first VM goes: its address leaves the export.
    with django_capture_on_commit_callbacks(execute=True):
        compute.vm_delete(vm=fresh(vm))
        report(fresh(vm), "absent")
    assert [kw["clients"] for kw in sent if kw["share_id"] == str(share.pk)][-1] == ()


def test_reports_delivered_again_late_change_neither_the_error_nor_the_usage(project):
    """Reports are delivered at least once: an old failure, or an older usage read, that
    comes after a newer report leaves the share as the newer one left it."""
    share = services.share_create(project=project, name="data", tier="fast", quota_gib=1)
    failed = {"share_id": str(share.pk), "generation": share.generation, "ok": False}
    failed |= {"error": "not applied; operators told", "detail": "lfs setquota: EPERM"}
    services.share_reported(host="mds-01", payload=failed, sent_at=timezone.now())
    assert Share.objects.get(pk=share.pk).last_error == "not applied; operators told"
    share = services.share_extend(share=share, quota_gib=2)
    taken_before = timezone.now()
    older = {"share_id": str(share.pk), "generation": share.generation, "ok": True}
    newer = {**older, "used_bytes": 500}
    services.share_reported(host="mds-01", payload=newer, sent_at=timezone.now())
    share.refresh_from_db()
    assert share.ready and share.last_error == "" and share.used_bytes == 500
    services.share_reported(host="mds-01", payload=failed, sent_at=timezone.now())
    assert Share.objects.get(pk=share.pk).last_error == ""
    services.share_reported(
        host="mds-01", payload={**older, "used_bytes": 100}, sent_at=taken_before
    )
    after = Share.objects.get(pk=share.pk)
    assert (after.last_error, after.used_bytes, after.usage_at) == ("", 500, share.usage_at)
