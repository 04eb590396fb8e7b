"""controlplane.tasks.agent_report: a report PostgreSQL aborted as a deadlock victim runs
again; any other database error is raised at once."""

import pytest
from django.db import OperationalError
from django.utils import timezone

from controlplane import agents, tasks
from controlplane.broker import BUNDLE_REPORT


class _PgError(Exception):
    def __init__(self, sqlstate):
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _flaky(monkeypatch, sqlstate, failures):
    calls = []

    def handler(**kwargs):
        calls.append(kwargs)
        if len(calls) <= failures:
            raise OperationalError("aborted") from _PgError(sqlstate)

    monkeypatch.setitem(agents._handlers, "test.flaky", handler)
    monkeypatch.setattr(tasks.time, "sleep", lambda seconds: None)
    return calls


def _report():
    tasks.agent_report.run(
        host="gpu-01", kind="test.flaky", payload={}, sent_at=timezone.now().isoformat()
    )


def test_a_deadlocked_report_runs_again(monkeypatch):
    calls = _flaky(monkeypatch, "40P01", failures=2)
    _report()
    assert len(calls) == 3


def test_it_gives_up_after_the_last_attempt(monkeypatch):
    calls = _flaky(monkeypatch, "40001", failures=tasks.REPORT_ATTEMPTS)
    with pytest.raises(OperationalError):
        _report()
    assert len(calls) == tasks.REPORT_ATTEMPTS


def test_other_database_errors_are_not_retried(monkeypatch):
    calls = _flaky(monkeypatch, "57P01", failures=1)  # admin_shutdown
    with pytest.raises(OperationalError):
        _report()
    assert len(calls) == 1


def test_a_bundle_hands_each_report_to_its_handler_in_order(monkeypatch):
    calls = []
    for kind in ("test.a", "test.b"):
        monkeypatch.setitem(
            agents._handlers, kind, lambda kind=kind, **kw: calls.append((kind, kw))
        )
    first, second = timezone.now(), timezone.now()
    tasks.agent_report.run(
        host="gpu-01",
        kind=BUNDLE_REPORT,
        payload={
            "reports": [
                {"kind": "test.a", "payload": {"n": 1}, "sent_at": first.isoformat()},
                {"kind": "test.unknown", "payload": {}, "sent_at": first.isoformat()},
                {"kind": "test.b", "payload": {"n": 2}, "sent_at": second.isoformat()},
            ]
        },
        sent_at=second.isoformat(),
    )
    assert calls == [
        ("test.a", {"host": "gpu-01", "payload": {"n": 1}, "sent_at": first}),
        ("test.b", {"host": "gpu-01", "payload": {"n": 2}, "sent_at": second}),
    ]


def test_a_failing_report_of_a_bundle_does_not_stop_the_others(monkeypatch):
    calls = []

    def broken(**kwargs):
        raise ValueError("broken")

    monkeypatch.setitem(agents._handlers, "test.broken", broken)
    monkeypatch.setitem(agents._handlers, "test.ok", lambda **kw: calls.append(kw))
    at = timezone.now().isoformat()
    parts = [{"kind": k, "payload": {}, "sent_at": at} for k in ("test.broken", "test.ok")]
    with pytest.raises(ValueError):
        tasks.agent_report.run(
            host="gpu-01", kind=BUNDLE_REPORT, payload={"reports": parts}, sent_at=at
        )
    assert len(calls) == 1
