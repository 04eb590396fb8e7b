import os
import socket

import httpx
import pytest
from rest_framework.test import APIClient

from tenants.choices import Role
from tests.factories import UserFactory, add_member, make_project, token_for
from tests.testdb import flush_by_delete

POSTGRES = os.environ.get("DATABASE_URL", "").startswith(("postgres", "postgresql"))


def pytest_collection_modifyitems(config, items):
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL: DATABASE_URL is not postgres://")
    for item in items:
        if "postgres" in item.keywords and not POSTGRES:
            item.add_marker(skip_pg)


@pytest.fixture(autouse=True)
def _reset_login_throttle(settings):
    # django-axes keeps failed attempts in the database; each test starts clean.
    settings.AXES_ENABLED = True


@pytest.fixture(autouse=True)
def _passes_when_asked(settings):
    # A release asks for a scheduling pass a second later (KUMO_SCHEDULE_ON_RELEASE_S): tests
    # run their passes themselves and read a VM as still waiting until they do.
    # tests/compute/test_pass_on_release.py turns it on.
    settings.SCHEDULE_ON_RELEASE_S = 0


@pytest.fixture(autouse=True)
def _fresh_views():
    # A process's view of the hosts and its index of evictable spot VMs would outlive the
    # rows a test rolls back (and SQLite gives a rolled-back row's id to the next one):
    # within the view's TTL, a test would otherwise place on the hosts of the test before.
    from compute import placement
    from compute.services import spot

    placement.view.invalidate()
    spot.index.invalidate()


@pytest.fixture
def client_for():
    """``client_for(user, project=None)``: an API client that authenticates like a real one,
    with a bearer token (scoped to ``project`` when given)."""

    def make(user=None, project=None):
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user, project)}")
        return client

    return make


@pytest.fixture
def staff(db):
    return UserFactory(is_staff=True, is_superuser=True)


@pytest.fixture
def project(db):
    return make_project()


@pytest.fixture
def other_project(db):
    return make_project()


@pytest.fixture
def users_by_role(project):
    """One user per role in ``project`` (the owner is the project's creator)."""
    users = {Role.OWNER: project.owner}
    for role in (Role.ADMIN, Role.MEMBER, Role.READER):
        users[role] = add_member(project, role=role)
    return users


def pytest_configure(config):
    from django.conf import settings

    # Hashing passwords properly is slow by design; tests make many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    if POSTGRES:
        flush_by_delete()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# One moto server per test run: its state (users, buckets) is global to the process, so
# the storage and SDK tests share this one instance rather than each starting their own.
@pytest.fixture(scope="session")
def s3_server():
    """A real S3 + IAM service on loopback (moto's server) that authenticates every request
    and enforces IAM policies, with an administrator's credentials: ``{endpoint,
    access_key, secret_key}``. Requests before ``reset-auth 0`` run unauthenticated; the
    administrator is made in that window."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"1000000")
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName="kumo-admin")
    iam.put_user_policy(
        UserName="kumo-admin",
        PolicyName="all",
        PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*",'
        '"Resource":"*"}]}',
    )
    key = iam.create_access_key(UserName="kumo-admin")["AccessKey"]
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"0")  # from now on, every request
    yield {
        "endpoint": endpoint,
        "access_key": key["AccessKeyId"],
        "secret_key": key["SecretAccessKey"],
    }
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"inf")
    server.stop()
