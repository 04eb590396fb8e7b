"""``Idempotency-Key`` on POST: a retried request gets the first response, never a second object.

The key row is inserted in the same transaction as the work it guards, so either both commit
or neither does. A concurrent duplicate blocks on the unique index (PostgreSQL) or on the
write lock (SQLite, IMMEDIATE transactions) until the first commits, then replays its response.
Only successful responses are kept: a request that failed may be retried with the same key.
"""

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from controlplane.errors import InvalidInput, KumoError
from controlplane.models import IdempotencyKey

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255


class KeyReused(KumoError):
    status = 422
    code = "idempotency_key_reused"


def fingerprint(request) -> str:
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def _replay(entry: IdempotencyKey) -> Response:
    headers = {"Idempotent-Replayed": "true"}
    if entry.location:
        headers["Location"] = entry.location
    return Response(entry.response, status=entry.status_code, headers=headers)


def run(handler, request, *args, **kwargs) -> Response:
    """Run ``handler`` at most once per (user, Idempotency-Key)."""
    key = request.headers.get(HEADER, "").strip()
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise InvalidInput.field(HEADER, f"must be 1 to {MAX_KEY_LENGTH} printable characters")
    fp = fingerprint(request)
    ttl_start = timezone.now() - timedelta(hours=settings.IDEMPOTENCY_TTL_H)
    with transaction.atomic():
        try:
            with transaction.atomic():
                IdempotencyKey.objects.filter(
                    user=request.user, key=key, created_at__lt=ttl_start
                ).delete()
                entry = IdempotencyKey.objects.create(user=request.user, key=key, fingerprint=fp)
        except IntegrityError:
            entry = IdempotencyKey.objects.get(user=request.user, key=key)
            if entry.fingerprint != fp:
                raise KeyReused(
                    f"{HEADER} {key!r} was used for a different request; use a new key",
                    details={HEADER: ["used for a different request"]},
                ) from None
            return _replay(entry)

        response = handler(request, *args, **kwargs)
        if response.status_code >= 400:
            transaction.set_rollback(True)
            return response
        entry.status_code = response.status_code
        entry.response = json.loads(JSONRenderer().render(response.data) or b"null")
        entry.location = response.get("Location", "")
        entry.save(update_fields=["status_code", "response", "location"])
        return response
