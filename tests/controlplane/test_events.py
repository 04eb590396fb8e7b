"""Events reach the project: listed in the API, POSTed signed to its webhooks, mailed to
its admins; nothing is sent for a change that rolled back."""

import datetime
import http.server
import json
import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from controlplane import events, services
from controlplane.models import Event, Webhook
from controlplane.tasks import webhook_deliver
from tenants.choices import Role
from tests.factories import add_member
from tests.isolation import ProjectEndpointContract

pytestmark = pytest.mark.django_db


class Receiver(http.server.BaseHTTPRequestHandler):
    received: list = []
    status = 204

    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((dict(self.headers), data))
        self.send_response(Receiver.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver(settings):
    # the receiver is on loopback, which webhooks reach only where the operator allows it
    settings.WEBHOOK_ALLOWED_NETWORKS = ("127.0.0.0/8",)
    Receiver.received = []
    Receiver.status = 204
    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


def test_an_event_is_delivered_signed_to_the_webhooks_that_want_it(project, receiver):
    hook, secret = services.webhook_create(project=project, url=receiver, kinds=["vm.notice"])
    services.webhook_create(project=project, url=receiver + "/other", kinds=["budget.alert"])
    event = events.emit("vm.notice", project=project, message="evicted in 30 s")
    assert webhook_deliver(webhook_id=hook.pk, event_id=event.pk) == 204
    ((headers, data),) = Receiver.received
    assert json.loads(data)["kind"] == "vm.notice" and json.loads(data)["project"] == project.slug
    assert headers[events.SIGNATURE_HEADER] == events.signature(secret, data)
    assert Webhook.objects.get(pk=hook.pk).last_status == "204"


def test_a_failing_receiver_is_retried_and_a_refusal_is_not(project, receiver, monkeypatch):
    retries = []
    monkeypatch.setattr(webhook_deliver, "apply_async", lambda **kw: retries.append(kw))
    hook, _ = services.webhook_create(project=project, url=receiver)
    event = events.emit("vm.notice", project=project, message="m")
    Receiver.status = 503
    assert webhook_deliver(webhook_id=hook.pk, event_id=event.pk) == 503
    assert [r["kwargs"]["attempt"] for r in retries] == [2]
    Receiver.status = 410
    assert webhook_deliver(webhook_id=hook.pk, event_id=event.pk) == 410
    assert len(retries) == 1


def test_a_dead_webhook_is_one_log_line_per_failed_delivery_with_backoff(
    project, monkeypatch, caplog, settings
):
    """Issue 13, item 12: nothing listens; each failure is one line without a traceback,
    and the next attempt waits longer, until the last one gives up."""
    import socket

    settings.WEBHOOK_ALLOWED_NETWORKS = ("127.0.0.0/8",)  # the dead receiver is on loopback

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hook"  # closed once the block ends
    retries = []
    monkeypatch.setattr(webhook_deliver, "apply_async", lambda **kw: retries.append(kw))
    hook, _ = services.webhook_create(project=project, url=dead)
    event = events.emit("vm.notice", project=project, message="m")
    from controlplane.tasks import WEBHOOK_ATTEMPTS

    caplog.set_level("INFO", logger="controlplane.events")
    for attempt in range(1, WEBHOOK_ATTEMPTS + 1):
        webhook_deliver(webhook_id=hook.pk, event_id=event.pk, attempt=attempt)
    lines = [r for r in caplog.records if r.name == "controlplane.events"]
    assert len(lines) == WEBHOOK_ATTEMPTS
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert "given up" in lines[-1].getMessage()
    delays = [r["countdown"] for r in retries]
    assert len(delays) == WEBHOOK_ATTEMPTS - 1 and delays == sorted(delays) and delays[0] == 2
    assert Webhook.objects.get(pk=hook.pk).last_status.startswith("error")


def test_delivery_and_mail_wait_for_commit(project, django_capture_on_commit_callbacks):
    admin = add_member(project, role=Role.ADMIN)
    add_member(project, role=Role.READER)
    with django_capture_on_commit_callbacks(execute=True):
        events.emit("budget.alert", project=project, message="80 % of budget", mail=True)
    (sent,) = mail.outbox
    assert sorted(sent.to) == sorted([project.owner.email, admin.email])
    assert "budget.alert" in sent.subject
    with pytest.raises(RuntimeError), transaction.atomic():
        events.emit("budget.alert", project=project, message="rolled back", mail=True)
        raise RuntimeError
    assert len(mail.outbox) == 1 and not Event.objects.filter(message="rolled back").exists()


def test_the_secret_is_shown_once(client_for, project):
    api = client_for(project.owner)
    url = reverse("api:project-webhook-list", kwargs={"project_slug": project.slug})
    created = api.post(url, {"url": "https://example.org/kumo"}, format="json")
    assert created.status_code == 201 and len(created.json()["secret"]) == 64
    assert "secret" not in api.get(url).json()["results"][0]
    bad = api.post(url, {"url": "not a url"}, format="json")
    assert bad.status_code == 400 and "url" in bad.json()["details"]


def test_the_feed_filters_by_kind_and_object_id(client_for, project):
    member = add_member(project, role=Role.READER)
    notice = events.emit("vm.eviction_notice", project=project, message="a", obj=member)
    events.emit("vm.eviction_notice", project=project, message="b")
    events.emit("budget.threshold", project=project, message="c", obj=member)
    api = client_for(member)
    url = reverse("api:project-event-list", kwargs={"project_slug": project.slug})

    def messages(**query):
        answer = api.get(url, query)
        assert answer.status_code == 200
        return [e["message"] for e in answer.json()["results"]]

    assert messages(kind="vm.eviction_notice") == ["b", "a"]
    assert messages(object_id=notice.object_id) == ["c", "a"]
    assert messages(kind="budget.threshold", object_id=notice.object_id) == ["c"]
    assert messages(object_id="nothing-by-this-id") == []


def test_the_feed_filters_by_period(client_for, project):
    member = add_member(project, role=Role.READER)
    old = events.emit("vm.eviction_notice", project=project, message="old")
    middle = events.emit("vm.eviction_notice", project=project, message="middle")
    events.emit("budget.threshold", project=project, message="new")
    now = timezone.now()
    Event.objects.filter(pk=old.pk).update(created_at=now - timedelta(hours=3))
    Event.objects.filter(pk=middle.pk).update(created_at=now - timedelta(hours=1))
    api = client_for(member)
    url = reverse("api:project-event-list", kwargs={"project_slug": project.slug})

    def messages(**query):
        answer = api.get(url, query)
        assert answer.status_code == 200, answer.json()
        return [e["message"] for e in answer.json()["results"]]

    two_hours_ago = (now - timedelta(hours=2)).isoformat()
    assert messages(since=two_hours_ago) == ["new", "middle"]
    assert messages(until=two_hours_ago) == ["old"]
    at = Event.objects.get(pk=middle.pk).created_at
    assert messages(since=at.isoformat()) == ["new", "middle"]  # at or after
    assert messages(until=at.isoformat()) == ["old"]  # before
    # A time in another zone is the same instant; a zone-less one is read as UTC.
    tokyo = at.astimezone(datetime.timezone(timedelta(hours=9))).isoformat()
    assert messages(since=tokyo, kind="vm.eviction_notice") == ["middle"]
    assert messages(since=at.astimezone(datetime.UTC).replace(tzinfo=None).isoformat()) == [
        "new",
        "middle",
    ]
    refused = api.get(url, {"since": "yesterday"})
    assert refused.status_code == 400 and "since" in refused.json()["details"]


class TestEventIsolation(ProjectEndpointContract):
    basename = "project-event"
    actions = ("list", "retrieve")

    def make_object(self, project):
        return events.emit("test.event", project=project, message="hello")


class TestWebhookIsolation(ProjectEndpointContract):
    basename = "project-webhook"
    actions = ("list", "retrieve", "create", "delete")
    write_role = Role.ADMIN
    create_references_nothing = True

    def make_object(self, project):
        return services.webhook_create(project=project, url="https://example.org/h")[0]

    def create_payload(self, project):
        return {"url": "https://example.org/new"}

    def count(self, project):
        return Webhook.objects.for_project(project).count()
