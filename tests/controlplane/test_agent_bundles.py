"""The agent's periodic reports go out as one message (``controlplane.agent.reports.bundled``
and the ``Reports`` step of ``controlplane.agent.app``)."""

from types import SimpleNamespace

import pytest

from controlplane.agent import app as agent_app
from controlplane.agent import reports, runtime
from controlplane.agent.config import AgentConfig
from controlplane.broker import BUNDLE_REPORT


@pytest.fixture
def published(monkeypatch):
    messages = []
    monkeypatch.setattr(
        reports, "_publish", lambda host, kind, payload, sent_at: messages.append((kind, payload))
    )
    return messages


def test_reports_sent_inside_a_bundle_go_out_as_one_message(published):
    with reports.bundled("gpu-01"):
        reports.send("gpu-01", "heartbeat", {"version": "1"})
        reports.send("gpu-01", "compute.guests", {"guests": []})
        assert published == []
    [(kind, payload)] = published
    assert kind == BUNDLE_REPORT
    assert [(p["kind"], p["payload"]) for p in payload["reports"]] == [
        ("heartbeat", {"version": "1"}),
        ("compute.guests", {"guests": []}),
    ]
    # Outside a bundle a report goes alone, at once.
    reports.send("gpu-01", "operation.result", {"ok": True})
    assert published[-1] == ("operation.result", {"ok": True})


def test_an_empty_or_failed_bundle_sends_nothing(published):
    with reports.bundled("gpu-01"):
        pass
    with pytest.raises(RuntimeError), reports.bundled("gpu-01"):
        reports.send("gpu-01", "heartbeat", {})
        raise RuntimeError("the hypervisor went away")
    assert published == []
    reports.send("gpu-01", "heartbeat", {})  # and the next report is not caught in it
    assert published == [("heartbeat", {})]


def test_each_report_goes_out_when_due_with_the_heartbeat_first(published, monkeypatch):
    runtime.configure(AgentConfig.from_env(host="gpu-01", heartbeat_s=10.0, guests_report_s=30.0))
    made = []

    def reporter(name):
        def report():
            made.append(name)
            reports.send("gpu-01", name, {})

        return report

    monkeypatch.setattr(
        agent_app.plugins,
        "REPORTERS",
        [("compute:guests", "guests_report_s"), ("compute:inventory", "inventory_report_s")],
    )
    monkeypatch.setattr(agent_app, "_resolve", lambda path: reporter(path))
    timer = SimpleNamespace(
        call_after=lambda *a, **k: SimpleNamespace(cancel=lambda: None),
        call_repeatedly=lambda *a, **k: SimpleNamespace(cancel=lambda: None),
    )
    step = agent_app.Reports.__new__(agent_app.Reports)
    step.__init__(SimpleNamespace(timer=timer))
    step.start(SimpleNamespace(timer=timer))
    assert step.tick_s == 10.0
    clock = iter([1000.0, 1010.0, 1020.0, 1030.0])
    monkeypatch.setattr(agent_app.time, "monotonic", lambda: next(clock))
    for _ in range(4):
        step.tick()
    kinds = [[p["kind"] for p in payload["reports"]] for _, payload in published]
    assert kinds == [
        ["heartbeat", "compute:guests", "compute:inventory"],  # all at start
        ["heartbeat"],
        ["heartbeat"],
        ["heartbeat", "compute:guests"],
    ]
