"""Shares through the services and the agent's ``apply_share``, and the usage billing
reads (``storage.selectors.gib_hours``)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from compute.services.vms import apply_message
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


def test_a_failed_apply_is_recorded_and_not_ready(project):
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
    services.share_reported(host="mds-01", payload=report, sent_at=timezone.now())
    share.refresh_from_db()
    assert not share.ready and "not permitted" in share.last_error


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
