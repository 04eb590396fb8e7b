"""/healthz: the process answers. /readyz: it can reach its database and its broker."""

import logging

from django.db import connection
from django.http import JsonResponse

log = logging.getLogger(__name__)


def healthz(request):
    return JsonResponse({"status": "ok"})


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _check_broker() -> str | None:
    from controlplane.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def readyz(request):
    problems = {
        name: err
        for name, err in (("database", _check_database()), ("broker", _check_broker()))
        if err
    }
    if problems:
        log.warning("not ready: %s", problems)
        return JsonResponse({"status": "unavailable", "problems": problems}, status=503)
    return JsonResponse({"status": "ok", "checks": ["database", "broker"]})
