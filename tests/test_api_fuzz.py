"""Schemathesis drives every operation of the OpenAPI schema (/api/schema/), in-process.

Generated and malformed input (positive and negative modes; examples, coverage and fuzzing
phases) against the WSGI app, with every built-in check: no 5xx, every status code documented,
bodies, content types and headers as the schema says, malformed input refused, valid input not
refused, auth not ignored, unsupported methods answered 405.

The caller is a staff user (so /api/v1/admin/ is reachable) who owns a project, with a bearer
token. Path parameters, and body fields that name other objects, point at real objects half the
time, so requests get past the 404 (and the "no such user") to the code behind.
"""

import pytest
import schemathesis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.core.parameters import ParameterLocation
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance

from compute import services as compute_services
from controlplane.models import AuditEvent
from controlplane.services import operation_create
from controlplane.wsgi import application
from tenants import reviewers, services
from tenants.models import UsageRecord
from tests.factories import (
    UserFactory,
    add_member,
    make_host,
    make_image,
    make_project,
    make_template,
    make_vm,
)
from tests.testdb import module_rows

PASSWORD = "correct-horse-battery-staple"  # tests/factories.py

CONFIG = schemathesis.Config.from_dict(
    {
        # The test authenticates with a real token (``world``); a generated Authorization header
        # or session cookie would be replaced by it and no longer be what the case claims.
        "generation": {"with-security-parameters": False},
    }
)
schema = schemathesis.openapi.from_wsgi("/api/schema/", application, config=CONFIG)

# Real objects, by the name of the path parameter or body field that refers to them ({id} by
# the collection it is in: "id:tokens"). Filled per test by the ``world`` fixture, read while
# hypothesis draws a case.
REAL: dict[str, list[str]] = {}

# Body fields that must name an existing object, by operation: the schema can only say "string".
REFERENCES = {
    "POST /api/v1/admin/projects/": ["owner"],
    "POST /api/v1/admin/institution-reviewers/": ["user"],
    "POST /api/v1/user/tokens/": ["project"],
    "POST /api/v1/user/ssh-keys/": ["public_key"],
    "POST /api/v1/auth/login/": ["username", "password"],
    "POST /api/v1/projects/{project_slug}/volumes/{id}/attach/": ["vm"],
    "POST /api/v1/projects/{project_slug}/vms/": [
        "template",
        "image",
        "ssh_keys",
        "placement_group",
    ],
}

# Schema-valid input the API still refuses with a 400, by operation: the fields whose rule the
# schema cannot express (a reference to an existing object, an SSH key's encoding, one field
# against another, a date in the future). Any other 400 for schema-valid input still fails.
NOT_IN_SCHEMA = {
    "POST /api/v1/admin/projects/": {"owner", "valid_until"},  # an existing user; until >= from
    "PUT /api/v1/admin/projects/{slug}/": {"valid_until"},
    "PATCH /api/v1/admin/projects/{slug}/": {"valid_until"},
    "POST /api/v1/projects/": {"valid_until"},
    "PUT /api/v1/projects/{project_slug}/": {"valid_until"},
    "PATCH /api/v1/projects/{project_slug}/": {"valid_until"},
    "POST /api/v1/user/tokens/": {"project", "expires_at"},  # a project of yours; the future
    "POST /api/v1/user/ssh-keys/": {"public_key"},  # a well-formed OpenSSH public key
    # Identity: the password validators; a new project's free slug, a renewal's project and
    # end, a quota increase's resources; a return's comment; a free username.
    "POST /api/v1/admin/users/": {"username", "password"},
    # An existing username; a pair not designated already is the only other rule.
    "POST /api/v1/admin/institution-reviewers/": {"user"},
    "POST /api/v1/applications/": {
        "slug",
        "project",
        "title",
        "purpose",
        "valid_until",
        "vcpus",
        "kind",
    },
    "PATCH /api/v1/applications/{id}/": {"slug", "title", "purpose", "valid_until", "vcpus"},
    "PUT /api/v1/applications/{id}/": {"slug", "title", "purpose", "valid_until", "vcpus"},
    "POST /api/v1/applications/{id}/review/": {"comment", "decision"},
    "POST /api/v1/admin/templates/": {"gpu_model"},  # required when gpus is not 0
    # existing objects; an image's minimum disk and memory against the template's; a template
    # that allows spot; networks of the project, addresses inside their subnets
    "POST /api/v1/projects/{project_slug}/vms/": {
        "template",
        "image",
        "ssh_keys",
        "placement_group",
        "priority",
        "nics",
        "lease",
    },
    # A lease: not in the past, its end after its start and within the longest lease, a GPU
    # model the fleet has; GPUs or whole hosts, one of the two (whole hosts of a model whose
    # hosts all hold as many GPUs).
    "POST /api/v1/projects/{project_slug}/leases/": {
        "starts_at",
        "ends_at",
        "gpu_model",
        "gpus",
        "hosts",
    },
    # Network: names of the project's objects, and addresses against CIDRs (an IPv4
    # network without host bits, a gateway and pool inside it, no overlap).
    "POST /api/v1/admin/global-ip-pools/": {"cidr", "gateway_ip", "pool_start", "pool_end"},
    "POST /api/v1/projects/{project_slug}/networks/": {"cidr"},
    "POST /api/v1/projects/{project_slug}/subnets/": {
        "network",
        "cidr",
        "gateway_ip",
        "pool_start",
        "pool_end",
        "dns_servers",
    },
    # A subnet's PATCH changes its DNS servers only: they are what it must carry.
    "PATCH /api/v1/projects/{project_slug}/subnets/{id}/": {"dns_servers"},
    "POST /api/v1/projects/{project_slug}/ports/": {"network", "security_groups", "fixed_ip"},
    "PATCH /api/v1/projects/{project_slug}/ports/{id}/": {"security_groups"},
    "POST /api/v1/projects/{project_slug}/security-groups/": {"name"},
    "POST /api/v1/projects/{project_slug}/security-group-rules/": {
        "group",
        "remote_group",
        "remote_cidr",
        "port_min",
        "port_max",
    },
    "POST /api/v1/projects/{project_slug}/global-ips/{id}/associate/": {"port"},
    "POST /api/v1/projects/{project_slug}/port-forwards/": {"global_ip", "port"},
    "POST /api/v1/projects/{project_slug}/webhooks/": {"url"},  # a URI, but http(s) only
    "POST /api/v1/projects/{project_slug}/external-connections/": {
        "network",
        "vlan_id",
        "destination_cidr",
        "next_hop",
    },
    # Storage: a VM of the project; a volume or share only grows.
    "POST /api/v1/projects/{project_slug}/volumes/{id}/attach/": {"vm"},
    "POST /api/v1/projects/{project_slug}/volumes/{id}/extend/": {"size_gib"},
    "POST /api/v1/projects/{project_slug}/shares/{id}/extend/": {"quota_gib"},
    # Billing: a rate card starts after the last version and outside invoiced months, prices
    # each resource once (only GPUs by model) in the same currency, with factors up to 10; a
    # month to issue has ended and a project exists; points move by a non-zero amount of an
    # existing project; budget amounts are positive and thresholds do not repeat.
    "POST /api/v1/admin/rate-cards/": {
        "valid_from",
        "prices",
        "currency",
        "spot_factor",
        "reserved_factor",
        "held_factor",
    },
    "POST /api/v1/admin/invoices/issue/": {"period", "project"},
    "POST /api/v1/admin/points/": {"project", "amount"},
    "POST /api/v1/projects/{project_slug}/budgets/": {"amount", "thresholds"},
    # An image's bytes: not empty, and matching the checksum the image was registered with.
    "PUT /api/v1/projects/{project_slug}/images/{id}/file/": {"file", "checksum"},
    "PUT /api/v1/admin/images/{id}/file/": {"file", "checksum"},
    "PATCH /api/v1/projects/{project_slug}/budgets/{id}/": {"amount", "thresholds"},
}
# And in any text field, two rules of DRF's: no NUL characters (PostgreSQL text cannot hold
# them), and the value is trimmed first, so one made of whitespace only ("\x1e") is blank.
NUL_REFUSED = ["Null characters are not allowed."]
BLANK_REFUSED = ["This field may not be blank."]


def _explained(case, field: str, reasons: list) -> bool:
    if field in NOT_IN_SCHEMA.get(case.operation.label, set()) or reasons == NUL_REFUSED:
        return True
    sent = case.body.get(field) if isinstance(case.body, dict) else None
    return reasons == BLANK_REFUSED and isinstance(sent, str) and not sent.strip()


def kumo_positive_data_acceptance(ctx, response, case):
    """schemathesis' positive_data_acceptance, but for the 400s explained above, and the login's
    wrong credentials (schemathesis also lets a credential-granting operation answer 400 to
    well-formed but wrong credentials; it only recognises OAuth token URLs as such)."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        body = response.json() if response.status_code == 400 else {}
        if (
            case.operation.label == "POST /api/v1/auth/login/"
            and body.get("code") == "invalid_credentials"
        ):
            return None
        details = body.get("details") or {}
        if details and all(_explained(case, field, why) for field, why in details.items()):
            return None
        raise


def _ssh_public_key() -> str:
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    return public.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


@pytest.fixture(scope="module")
def world(request, django_db_setup, django_db_blocker):
    """A staff user who owns a project with another member (an institutional reviewer), an
    SSH key, a host, an operation and audit events; a user in no project; and a bearer token
    for the staff user. Made once for the module: each example runs in a savepoint rolled
    back afterwards, so no test changes what the next one sees."""
    with module_rows(request, django_db_blocker, _world) as headers:
        yield headers


def _world():
    staff = UserFactory(username="fuzz-staff", is_staff=True, is_superuser=True)
    outsider = UserFactory(username="fuzz-outsider")
    project = make_project(owner=staff, slug="fuzz-project")
    member = add_member(project)
    host = make_host("fuzz-host")
    template = make_template(gpus=1, name="fuzz-gpu")
    image = make_image()
    vm = make_vm(project, template=template, image=image, name="fuzz-vm")
    group = compute_services.placement_group_create(project=project, name="fuzz", policy="compact")
    operation = operation_create(kind="test.fuzz", target=project, project=project)
    token, secret = services.token_create(user=staff, name="fuzz")
    key = services.sshkey_add(user=staff, name="fuzz", public_key=_ssh_public_key())
    invoice, budget, points, rate_card = _billing(project)
    event = AuditEvent.objects.filter(project=project).latest("pk")
    reviewer = reviewers.reviewer_designate(
        user=member, issuer="https://idp.fuzz.example/idp", actor=staff
    )
    from storage import services as storage

    volume = storage.volume_create(project=project, name="fuzz", size_gib=1)
    REAL.clear()
    REAL.update(
        # path parameters
        project_slug=[project.slug],
        slug=[project.slug],
        username=[staff.username, member.username, outsider.username],
        name=[host.name, template.name],
        **{
            "id:operations": [str(operation.pk)],
            "id:tokens": [str(token.pk)],
            "id:ssh-keys": [str(key.pk)],
            "id:audit-events": [str(event.pk)],
            "id:vms": [str(vm.pk)],
            "id:images": [str(image.pk)],
            "id:placement-groups": [str(group.pk)],
            "id:devices": [str(vm.devices.first().pk)],
            "id:volumes": [str(volume.pk)],
            "id:invoices": [str(invoice.pk)],
            "id:budgets": [str(budget.pk)],
            "id:points": [str(points.pk)],
            "id:rate-cards": [str(rate_card.pk)],
            "id:institution-reviewers": [str(reviewer.pk)],
            "id:usage-records": [str(UsageRecord.objects.filter(project=project).first().pk)],
        },
        # body fields
        owner=[outsider.username, staff.username],
        user=[outsider.username, member.username],
        project=[project.slug],
        public_key=[_ssh_public_key()],
        password=[PASSWORD],
        template=[template.name],
        image=[image.pk],
        ssh_keys=[[key.name]],
        placement_group=[group.name],
        vm=[str(vm.pk)],
    )
    return {"Authorization": f"Bearer {secret}"}


def _billing(project):
    """A rate card, an invoice of a past month, a budget and a points credit."""
    from datetime import UTC, date, datetime, timedelta
    from decimal import Decimal

    from tenants import billing

    resources = ("vcpu", "memory", "gpu", "storage", "global_ip")
    rate_card = billing.rate_card_create(
        valid_from=datetime(2024, 1, 1, tzinfo=UTC),
        prices=[{"resource": r, "unit_price": "1"} for r in resources],
    )
    start = datetime(2024, 6, 1, tzinfo=UTC)
    UsageRecord.objects.create(
        project=project,
        subject_type="tests.fuzz",
        subject_id="1",
        resource="vcpu",
        quantity=1,
        started_at=start,
        ended_at=start + timedelta(hours=1),
    )
    [invoice] = billing.invoices_issue(period=date(2024, 6, 1), projects=[project])
    budget = billing.budget_create(project=project, name="fuzz", amount=Decimal(100))
    points = billing.points_credit(project=project, amount=Decimal(10))
    return invoice, budget, points, rate_card


@pytest.fixture
def same_connection():
    """Requests reach the WSGI app in-process and run in the test's transaction: keep Django
    from closing that connection at the end of each request (its test client does the same)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _point_at_real_objects(case, data) -> None:
    """Half the time, give a valid path parameter or reference field a real object's name.
    (The containers are assigned, not edited in place, so that schemathesis re-validates the
    case and what it says about the case stays true.)"""
    meta = case.meta
    if case.path_parameters and not meta.is_negative_at(ParameterLocation.PATH):
        params = dict(case.path_parameters)
        for name in params:
            key = f"id:{case.path.split('/{id}')[0].rsplit('/', 1)[-1]}" if name == "id" else name
            if key in REAL and data.draw(st.booleans(), label=f"real {name}"):
                params[name] = data.draw(st.sampled_from(REAL[key]), label=name)
        case.path_parameters = params
    fields = REFERENCES.get(case.operation.label, [])
    if fields and isinstance(case.body, dict) and not meta.is_negative_at(ParameterLocation.BODY):
        body = dict(case.body)
        for name in fields:
            if name in body and data.draw(st.booleans(), label=f"real {name}"):
                body[name] = data.draw(st.sampled_from(REAL[name]), label=name)
        case.body = body


@schema.parametrize()
@schema.given(data=st.data())
# Derandomized: the same examples on every run, so a red CI names a bug, not a draw; a new
# operation or a changed schema still brings new examples.
@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_api(case, data, db, world, same_connection):
    _point_at_real_objects(case, data)
    # Each example runs in a savepoint rolled back afterwards: no example sees another's writes
    # (a deleted project, a revoked token, django-axes' failed logins).
    with transaction.atomic():
        case.call_and_validate(
            headers=world,
            excluded_checks=[positive_data_acceptance],
            additional_checks=[kumo_positive_data_acceptance],
        )
        transaction.set_rollback(True)
