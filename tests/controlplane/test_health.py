"""/healthz, /readyz and /metrics."""

import pytest

pytestmark = pytest.mark.django_db


def test_healthz(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_checks_database_and_broker(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == ["database", "broker"]


def test_readyz_is_503_naming_an_unreachable_broker(client, monkeypatch):
    from kombu import Connection

    from controlplane.celery import app

    # A real connection attempt to a port where nothing listens.
    monkeypatch.setattr(app, "connection_for_write", lambda: Connection("redis://127.0.0.1:1/0"))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert set(response.json()["problems"]) == {"broker"}


def test_metrics_count_requests_and_celery_tasks(client):
    from controlplane import metrics

    metrics.TASKS.labels("kumo.test.task", "success").inc()
    client.get("/healthz")
    text = client.get("/metrics").content.decode()
    assert 'kumo_celery_tasks_total{outcome="success",task="kumo.test.task"}' in text
    assert "django_http_requests_latency_seconds_by_view_method" in text
