"""Fixtures of the portal tests: a project with one user per role, a GPU host, a template,
an image and a rate card."""

from datetime import UTC, datetime

import pytest
from django.test import Client

from tenants import billing
from tenants import services as tenants
from tests.factories import make_host, make_image, make_template

PRICES = [
    {"resource": "vcpu", "unit_price": "10"},
    {"resource": "memory", "unit_price": "1.5"},
    {"resource": "gpu", "unit_price": "300"},
    {"resource": "gpu", "model": "A100-SXM4-40GB", "unit_price": "500"},
    {"resource": "storage", "unit_price": "7.3"},
    {"resource": "global_ip", "unit_price": "2"},
]


@pytest.fixture(scope="session", autouse=True)
def _compiled_translations():
    # The .mo files are generated (never committed): compile them when missing or stale.
    from controlplane.portal.locale import compile_catalogues

    compile_catalogues()


@pytest.fixture
def login():
    """``login(user)``: a browser-like client logged in as ``user`` (session and CSRF)."""

    def make(user, *, csrf=False):
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client

    return make


@pytest.fixture
def cloud(project, users_by_role):
    """Room in ``project``, an up GPU host, a CPU and a 1-GPU template, a public image."""
    tenants.quota_set(project=project, vcpus=512, memory_gib=4096, gpus=16, vms=20)
    return {
        "host": make_host(),
        "cpu": make_template(),
        "gpu": make_template(gpus=1),
        "image": make_image(),
        "users": users_by_role,
    }


@pytest.fixture
def rate_card(db):
    return billing.rate_card_create(valid_from=datetime(2020, 1, 1, tzinfo=UTC), prices=PRICES)
