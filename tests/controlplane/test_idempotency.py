"""controlplane/api/idempotency.py: a POST retried with its Idempotency-Key runs once."""

import threading
from datetime import timedelta

import pytest
from django.db import connection

from controlplane.models import IdempotencyKey
from controlplane.services import idempotency_keys_purge
from tenants.models import Project, SSHKey
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PROJECTS = "/api/v1/projects/"


def _post(client, body, key, url=PROJECTS):
    return client.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_same_key_and_body_replays_the_first_response(client_for, staff):
    client = client_for(staff)
    body = {"slug": "replayed", "name": "Replayed"}
    first = _post(client, body, "key-1")
    assert first.status_code == 201, first.content
    assert "Idempotent-Replayed" not in first
    again = _post(client, body, "key-1")
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert again["Location"] == first["Location"]
    assert Project.objects.filter(slug="replayed").count() == 1


def test_without_a_key_a_repeat_is_a_new_request(client_for, staff):
    client = client_for(staff)
    body = {"slug": "twice", "name": "Twice"}
    assert client.post(PROJECTS, body).status_code == 201
    assert client.post(PROJECTS, body).status_code == 409  # not a replay
    assert not IdempotencyKey.objects.exists()


def test_same_key_with_another_body_is_422(client_for, staff):
    client = client_for(staff)
    assert _post(client, {"slug": "first-one", "name": "A"}, "key-2").status_code == 201
    response = _post(client, {"slug": "second-one", "name": "B"}, "key-2")
    assert response.status_code == 422
    assert response.json()["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in response.json()["details"]
    assert not Project.objects.filter(slug="second-one").exists()


def test_same_key_on_another_endpoint_is_422(client_for, staff):
    client = client_for(staff)
    assert _post(client, {"slug": "some-proj", "name": "A"}, "key-3").status_code == 201
    response = _post(client, {"name": "A"}, "key-3", url="/api/v1/user/tokens/")
    assert response.status_code == 422


def test_a_failed_request_can_be_retried_with_its_key(client_for, staff):
    client = client_for(staff)
    bad = _post(client, {"slug": "Bad_Slug", "name": "A"}, "key-4")
    assert bad.status_code == 400
    assert not IdempotencyKey.objects.filter(key="key-4").exists()
    good = _post(client, {"slug": "good-slug", "name": "A"}, "key-4")
    assert good.status_code == 201, good.content
    assert "Idempotent-Replayed" not in good
    assert Project.objects.filter(slug="good-slug").exists()


def test_a_conflict_is_not_stored_either(client_for, staff, project):
    client = client_for(staff)
    body = {"slug": "will-free-up", "name": "A"}
    taken = Project.objects.create(slug="will-free-up", name="x", owner=project.owner)
    assert _post(client, body, "key-5").status_code == 409
    taken.delete()
    assert _post(client, body, "key-5").status_code == 201


def test_keys_are_per_user(client_for, staff):
    other_staff = UserFactory(is_staff=True)
    assert _post(client_for(staff), {"slug": "mine-one", "name": "A"}, "shared").status_code == 201
    theirs = _post(client_for(other_staff), {"slug": "theirs-one", "name": "B"}, "shared")
    assert theirs.status_code == 201
    assert "Idempotent-Replayed" not in theirs
    assert Project.objects.get(slug="theirs-one").owner == other_staff


def test_a_replay_needs_the_same_user_not_the_same_token(client_for, staff):
    body = {"slug": "two-tokens", "name": "A"}
    clients = [client_for(staff) for _ in range(2)]  # each with a token of its own
    first = _post(clients[0], body, "k")
    again = _post(clients[1], body, "k")
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\tkey"])
def test_a_malformed_key_is_400(client_for, staff, key):
    response = _post(client_for(staff), {"slug": "never-made", "name": "A"}, key)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["details"]
    assert not Project.objects.filter(slug="never-made").exists()


def test_keys_work_on_every_post_endpoint(client_for):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    line = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    user = UserFactory()
    client = client_for(user)
    first = _post(client, {"public_key": line}, "ssh-1", url="/api/v1/user/ssh-keys/")
    again = _post(client, {"public_key": line}, "ssh-1", url="/api/v1/user/ssh-keys/")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json()
    assert SSHKey.objects.filter(user=user).count() == 1


def test_an_expired_key_is_a_new_request(client_for, staff, settings):
    client = client_for(staff)
    assert _post(client, {"slug": "old-one", "name": "A"}, "old").status_code == 201
    IdempotencyKey.objects.filter(key="old").update(
        created_at=IdempotencyKey.objects.get(key="old").created_at
        - timedelta(hours=settings.IDEMPOTENCY_TTL_H + 1)
    )
    response = _post(client, {"slug": "new-one", "name": "B"}, "old")
    assert response.status_code == 201
    assert IdempotencyKey.objects.filter(key="old").count() == 1


def test_purge_removes_only_expired_keys(client_for, staff, settings):
    client = client_for(staff)
    _post(client, {"slug": "keep-one", "name": "A"}, "fresh")
    _post(client, {"slug": "drop-one", "name": "B"}, "stale")
    stale = IdempotencyKey.objects.get(key="stale")
    IdempotencyKey.objects.filter(pk=stale.pk).update(
        created_at=stale.created_at - timedelta(hours=settings.IDEMPOTENCY_TTL_H + 1)
    )
    assert idempotency_keys_purge() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["fresh"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicates_create_one_object_and_answer_alike(client_for):
    staff = UserFactory(is_staff=True)
    body = {"slug": "raced", "name": "Raced"}
    clients = [client_for(staff) for _ in range(8)]
    barrier = threading.Barrier(len(clients))
    responses: list = [None] * len(clients)
    errors: list = []

    def post(index):
        try:
            barrier.wait(timeout=10)
            responses[index] = _post(clients[index], body, "race-key")
        except Exception as e:  # surfaced below; a thread's exception is otherwise lost
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert [r.status_code for r in responses] == [201] * len(clients), [
        r.content for r in responses
    ]
    # jsonb does not keep key order, so compare the documents, not their bytes
    assert all(r.json() == responses[0].json() for r in responses)
    assert len({r["Location"] for r in responses}) == 1
    assert sum(r.get("Idempotent-Replayed") == "true" for r in responses) == len(clients) - 1
    assert Project.objects.filter(slug="raced").count() == 1
    assert IdempotencyKey.objects.filter(key="race-key").count() == 1
