import os

import pytest
from rest_framework.test import APIClient

from tenants.choices import Role
from tests.factories import UserFactory, add_member, make_project, token_for

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
def _fresh_spot_index():
    # A process's index of evictable spot VMs would outlive the rows a test rolls back.
    from compute.services import spot

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
