"""A live Kumo for the SDK and CLI tests: gunicorn on a free loopback port, on the test
database (committed data: the tests use ``transactional_db``), started once per session,
with moto's S3 + IAM server (``tests.storage``'s ``s3_server``) as its object store.
``hosts`` adds the controller and a simulated host agent for a test that needs VMs to run.
"""

import functools
import os
import secrets
from dataclasses import dataclass

import httpx
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from kumo_sdk import Client
from kumo_sdk.cli import app
from typer.testing import CliRunner

from compute.choices import HostState
from compute.management.commands.simfleet import write_and_register
from compute.models import Host
from tenants import services as tenants
from tenants.federation.demo_idp import DemoIdP, serve
from tests.e2e.processes import Fleet, database_url, free_port, start_topology, wait_for
from tests.factories import UserFactory, make_project, token_for

PASSWORD = "correct-horse-battery-staple"


def can_log_in(user):
    """Give ``user`` the password ``PASSWORD``, hashed as the server checks it (the test
    process itself hashes with MD5, which gunicorn does not accept)."""
    user.password = _server_hash()
    user.save(update_fields=["password"])
    return user


@functools.cache
def _server_hash() -> str:
    """``PASSWORD`` hashed once per run (a million PBKDF2 rounds take a third of a second)."""
    hasher = PBKDF2PasswordHasher()
    return hasher.encode(PASSWORD, hasher.salt())


@dataclass
class Server:
    url: str
    bind: str
    fleet: Fleet


@pytest.fixture(scope="session")
def server(django_db_setup, tmp_path_factory, s3_server):
    var = tmp_path_factory.mktemp("kumo-sdk")
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL="filesystem://",
        KUMO_VAR_DIR=str(var),
        KUMO_HEARTBEAT_INTERVAL_S="1",
        KUMO_GUESTS_REPORT_INTERVAL_S="2",
        KUMO_RECONCILE_GRACE_S="1",
        DATABASE_TEST_NAME="",
        # Given, not generated: settings' generated key can be read empty by a gunicorn
        # worker while another one is still writing it (a 500 on every request).
        SECRET_KEY=secrets.token_urlsafe(50),
        KUMO_OBJECT_STORE="s3iam",
        KUMO_OBJECT_STORE_ENDPOINT=s3_server["endpoint"],
        KUMO_OBJECT_STORE_ACCESS_KEY=s3_server["access_key"],
        KUMO_OBJECT_STORE_SECRET_KEY=s3_server["secret_key"],
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    bind = f"127.0.0.1:{free_port()}"
    url = f"http://{bind}"
    idp_server, _ = demo_federation(env, var, url)
    fleet = Fleet(env, var)
    start_topology(fleet, bind=bind, hosts=[], only={"web"})

    def answers():
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, timeout=60, what="gunicorn answering", fleet=fleet)
        yield Server(url=url, bind=bind, fleet=fleet)
    finally:
        fleet.stop()
        idp_server.shutdown()


def demo_federation(env: dict, var, url: str):
    """The demo IdP of ``make run`` (a real pysaml2 IdP) on a free port, in a thread, and
    ``env`` pointing the server at its federation's signed aggregate (which ``manage.py
    bootstrap`` loads), as ``make run`` does."""
    idp = DemoIdP(
        base_url=f"http://127.0.0.1:{free_port()}",
        workdir=var / "demo-idp",
        sp_metadata_url=f"{url}/saml2/metadata/",
    )
    aggregate, cert = idp.write_federation()
    env.update(
        KUMO_BASE_URL=url,
        KUMO_SAML_METADATA_URL=str(aggregate),
        KUMO_SAML_FEDERATION_CERT=str(cert),
    )
    port = int(idp.base_url.rsplit(":", 1)[1])
    return serve(idp, "127.0.0.1", port)


@pytest.fixture
def hosts(server, transactional_db, tmp_path):
    """The controller, beat (whose reconcile re-sends work a lost message dropped) and one
    simulated CPU host's agent, up and reporting; stopped after."""
    names = ["cpu-01"]
    uris = write_and_register(tmp_path / "fleet", names)
    only = {"controller", "beat", *(f"agent-{n}" for n in names)}
    start_topology(server.fleet, bind=server.bind, hosts=names, uris=uris, only=only)

    def up():
        return Host.objects.filter(
            name__in=names, state=HostState.UP, guests_reported_at__isnull=False
        ).count() == len(names)

    try:
        wait_for(up, timeout=60, what="the agent up and reporting", fleet=server.fleet)
        yield names
    finally:
        for name in only:
            server.fleet.kill(name)


@pytest.fixture
def owner(transactional_db):
    return UserFactory()


@pytest.fixture
def project(owner):
    project = make_project(owner=owner)
    tenants.quota_set(project=project, vcpus=64, memory_gib=256, vms=10, networks=10)
    return project


@pytest.fixture
def kumo(server, owner, project):
    """The SDK, as the project's owner, with no delay between retries."""
    with Client(server.url, token_for(owner), project=project.slug, backoff=0) as client:
        yield client


@pytest.fixture
def kumo_cli(tmp_path):
    """``kumo_cli(*args)``: run ``kumo`` with its config file in ``tmp_path``; returns the
    result (``stdout`` and ``stderr`` apart)."""
    runner = CliRunner()
    env = {"KUMO_CONFIG": str(tmp_path / "kumo" / "config.json"), "KUMO_PROJECT": None}

    def run(*args: str, ok: bool = True):
        result = runner.invoke(app, list(args), env=env)
        if ok:
            assert result.exit_code == 0, (args, result.output, result.exception)
        return result

    run.config = tmp_path / "kumo" / "config.json"
    return run


@pytest.fixture
def logged_in(server, owner, project, kumo_cli):
    can_log_in(owner)
    kumo_cli("login", server.url, "--username", owner.username, "--password", PASSWORD)
    return kumo_cli
