"""Every list endpoint runs the same number of SQL queries for a page of 1 as for a page of
many: no query per row. Endpoints are found on the routers, so a new one is covered (and
fails here until the seed below gives it rows)."""

import json
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from compute import services as compute
from controlplane.api.urls import admin_router, project_router, user_router
from controlplane.services import operation_create
from tenants import services as tenants
from tests.factories import (
    UserFactory,
    add_member,
    enroll_network,
    make_host,
    make_image,
    make_network,
    make_pool,
    make_project,
    make_template,
    make_vm,
)
from tests.tenants.test_sshkeys import _openssh_public
from tests.testdb import module_rows

pytestmark = pytest.mark.django_db

# One object per project: nothing to page.
SINGLETONS = {"project-quota", "project-forecast", "project-reclamation"}


def list_endpoints():
    for router in (user_router, project_router, admin_router):
        for _prefix, viewset, basename in router.registry:
            if hasattr(viewset, "list") and basename not in SINGLETONS:
                yield basename


@dataclass
class Seeded:
    project: object  # the staff user's project, with rows of every kind
    staff: object


@pytest.fixture(scope="module")
def seeded(request, django_db_setup, django_db_blocker):
    """Three rows at least of every list, made once for the module (each test runs in a
    savepoint and leaves them as they were)."""
    with (
        pytest.MonkeyPatch.context() as patch,
        module_rows(request, django_db_blocker, lambda: _seed(patch)) as seeded,
    ):
        yield seeded


def _seed(patch) -> Seeded:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    staff = UserFactory(is_staff=True, is_superuser=True)
    project = make_project(owner=staff)
    for n in range(3):
        make_project(owner=staff)
        add_member(project)
        tenants.sshkey_add(
            user=staff,
            public_key=_openssh_public(ed25519.Ed25519PrivateKey.generate()),
            name=f"k{n}",
        )
        tenants.token_create(user=staff, name=f"t{n}", project=project if n else None)
        host = make_host(f"h-{n}")
        make_vm(project, template=make_template(gpus=1), image=make_image(project=project))
        compute.placement_group_create(project=project, name=f"pg{n}", policy="compact")
        compute.guarantee_set(project=make_project(owner=staff), min_gpus=n + 1)
        start = timezone.now() + timedelta(days=n + 1)
        compute.lease_create(
            project=project,
            name=f"l{n}",
            gpus=1,
            starts_at=start,
            ends_at=start + timedelta(hours=1),
        )
        operation_create(kind="test", target=host)
        operation_create(kind="test", target=project, project=project)
        _seed_network(project, host, n)
        _seed_storage(project, host, n, patch)
        _seed_billing(project, n)
        _seed_access(project, staff, n)
    return Seeded(project=project, staff=staff)


def _seed_access(project, staff, n):
    """An invitation, an application, a user with a federated identity and a reviewer."""
    from tenants import applications, invitations, reviewers
    from tenants.models import ExternalIdentity
    from tests.factories import UserFactory

    invitations.invitation_create(project=project, email=f"i{n}@example.org", actor=staff)
    applications.application_submit(
        applicant=staff, slug=f"applied-{n}", title=f"a{n}", purpose="p", gpus=1
    )
    ExternalIdentity.objects.create(user=UserFactory(), issuer="https://idp", subject=f"s{n}")
    reviewers.reviewer_designate(user=UserFactory(), issuer=f"https://idp{n}.example", actor=staff)


def _seed_billing(project, n):
    """A rate card version, a day of usage in a past month invoiced, a budget, points."""
    from datetime import UTC, date, datetime, timedelta

    from tenants import billing
    from tenants.models import UsageRecord

    resources = ("vcpu", "memory", "gpu", "storage", "global_ip")
    prices = [{"resource": r, "unit_price": "1"} for r in resources]
    for month in range(1, 4) if n == 0 else ():  # three versions, before any invoice
        billing.rate_card_create(valid_from=datetime(2024, month, 1, tzinfo=UTC), prices=prices)
    start = datetime(2025, n + 1, 1, tzinfo=UTC)
    UsageRecord.objects.create(
        project=project,
        subject_type="tests.seed",
        subject_id=str(n),
        resource="storage",
        quantity=10,
        started_at=start,
        ended_at=start + timedelta(days=1),
    )
    billing.invoices_issue(period=date(2025, n + 1, 1), projects=[project])
    billing.budget_create(project=project, name=f"budget{n}", amount=100 * (n + 1))
    billing.points_credit(project=project, amount=10)


def _seed_storage(project, host, n, patch):
    from storage import services as storage
    from storage.drivers.fake import FakeObjectStore

    if n == 0:
        store = FakeObjectStore()
        patch.setattr(storage, "object_store", lambda: store)
    storage.volume_create(project=project, name=f"vol{n}", size_gib=1)
    tiers = {"fast": {"backend": "nfs", "host": "h-0", "source": "n:/x"}}
    with override_settings(SHARE_TIERS=tiers):
        storage.share_create(project=project, name=f"share{n}", tier="fast", quota_gib=1)
    storage.bucket_create(project=project, name=f"bucket-{n}", quota_gib=1)
    storage.access_key_create(project=project)


def _seed_network(project, host, n):
    from network import services as network
    from tenants.models import Quota

    Quota.objects.filter(project=project).update(networks=10, global_ips=10)
    enroll_network(host, f"10.99.0.{n + 1}", gateway=n == 0, external_bridge="brx")
    make_pool(name=f"pool{n}", cidr=f"198.51.{100 + n}.0/24", gateway_ip=f"198.51.{100 + n}.1")
    net = make_network(project, f"net{n}", cidr=f"10.{n}.0.0/24", external_access=True)
    port = network.port_create(network=net, host=host, binding="veth", binding_netns="x")
    group = network.security_group_create(project=project, name=f"sg{n}")
    network.rule_create(group=group, direction="ingress", protocol="tcp", port_min=22)
    address = network.global_ip_allocate(project=project)
    network.port_forward_create(
        address=address, protocol="tcp", external_port=22, port=port, internal_port=22
    )
    from controlplane import events
    from controlplane import services as control

    events.emit("test.event", project=project, message=f"event {n}")
    control.webhook_create(project=project, url=f"https://example.org/{n}")
    network.connection_request(
        project=project, name=f"c{n}", kind="l2vpn", network=net, vlan_id=n + 1
    )


@pytest.mark.parametrize("basename", sorted(list_endpoints()))
def test_list_queries_do_not_grow_with_the_page(client_for, seeded, basename):
    kwargs = {"project_slug": seeded.project.slug} if basename.startswith("project-") else {}
    url = reverse(f"api:{basename}-list", kwargs=kwargs)
    api = client_for(seeded.staff)
    api.get(url)  # warm up: the token's first use records its last-used time

    def run(page_size):
        with CaptureQueriesContext(connection) as ctx:
            response = api.get(url, {"page_size": page_size})
        assert response.status_code == 200, response.content
        return len(ctx.captured_queries), len(response.json()["results"])

    one, rows_one = run(1)
    many, rows_many = run(50)
    assert rows_one == 1 and rows_many >= 3, f"seed more rows for {basename}"
    assert many == one
    assert one == QUERIES[basename], f"{basename} now makes {one} queries"


# Each list's queries, pinned: the token (with the caller's membership, on project endpoints)
# and the page (with the list's count); VMs, ports and security groups add the prefetches of
# their related rows.
QUERIES = {
    "admin-user": 3,  # and the users' identities, prefetched
    "admin-institutionreviewer": 2,
    "application": 2,
    "project-invitation": 2,
    "admin-auditevent": 2,
    "admin-bucket": 2,
    "admin-capacityguarantee": 2,
    "admin-device": 2,
    "admin-externalconnection": 2,
    "admin-globalippool": 2,
    "admin-host": 2,
    "admin-hostnetwork": 2,
    "admin-image": 2,
    "admin-invoice": 2,
    "admin-lease": 2,
    "admin-operation": 2,
    "admin-pointsentry": 2,
    "admin-project": 2,
    "admin-ratecard": 3,
    "admin-share": 2,
    "admin-template": 2,
    "admin-vm": 4,
    "admin-volume": 2,
    "project": 2,
    "project-accesskey": 2,
    "project-auditevent": 2,
    "project-bucket": 2,
    "project-budget": 2,
    "project-event": 2,
    "project-externalconnection": 2,
    "project-globalip": 2,
    "project-image": 2,
    "project-invoice": 2,
    "project-lease": 2,
    "project-member": 2,
    "project-network": 2,
    "project-operation": 2,
    "project-placementgroup": 2,
    "project-pointsentry": 2,
    "project-port": 5,
    "project-portforward": 2,
    "project-securitygroup": 3,
    "project-securitygrouprule": 2,
    "project-share": 2,
    "project-subnet": 2,
    "project-usagerecord": 2,
    "project-vm": 4,
    "project-volume": 2,
    "project-webhook": 2,
    "sshkey": 2,
    "template": 2,
    "token": 2,
}


def _answer(api, url, params=None):
    response = api.get(url, params or {})
    assert response.status_code == 200, response.content
    return response.content


@pytest.mark.parametrize("basename", sorted(set(list_endpoints())))
def test_the_read_path_answers_byte_for_byte_as_the_serializer(
    client_for, seeded, basename, monkeypatch
):
    """Lists and details answered from a read plan (``controlplane.api.fastread``) are the
    same bytes as DRF's serializer gives for the same rows."""
    from controlplane.api import fastread

    kwargs = {"project_slug": seeded.project.slug} if basename.startswith("project-") else {}
    url = reverse(f"api:{basename}-list", kwargs=kwargs)
    api = client_for(seeded.staff)
    api.get(url)  # the token's first use records its last-used time
    planned = _answer(api, url, {"page_size": 50})
    rows = json.loads(planned)["results"]
    viewset = _viewset(basename)
    field, kwarg = viewset.lookup_field, viewset.lookup_url_kwarg or viewset.lookup_field
    details = {}
    if hasattr(viewset, "retrieve") and rows and field in rows[0]:
        for row in rows[:3]:
            detail = reverse(f"api:{basename}-detail", kwargs={**kwargs, kwarg: row[field]})
            details[detail] = _answer(api, detail)
    with monkeypatch.context() as m:
        m.setattr(fastread, "plan_for", lambda serializer_class: None)
        assert _answer(api, url, {"page_size": 50}) == planned
        for detail, body in details.items():
            assert _answer(api, detail) == body


def _viewset(basename):
    for router in (user_router, project_router, admin_router):
        for _prefix, viewset, name in router.registry:
            if name == basename:
                return viewset
    raise LookupError(basename)


def test_which_lists_take_the_read_path():
    """The endpoints whose serializer is a plain read of columns answer from a read plan; a
    change that loses one its plan (or gives one to a serializer that computes) shows here."""
    from controlplane.api import fastread

    planned = {
        basename
        for basename in list_endpoints()
        if (serializer_class := getattr(_viewset(basename), "serializer_class", None))
        and fastread.plan_for(serializer_class) is not None
    }
    assert planned == PLANNED, sorted(planned)


PLANNED = {
    "application",
    "admin-lease",
    "admin-auditevent",
    "admin-capacityguarantee",
    "admin-externalconnection",
    "admin-globalippool",
    "admin-image",
    "admin-institutionreviewer",
    "admin-invoice",
    "admin-template",
    "project-accesskey",
    "project-auditevent",
    "project-budget",
    "project-event",
    "project-externalconnection",
    "project-image",
    "project-invoice",
    "project-lease",
    "project-network",
    "project-placementgroup",
    "project-securitygrouprule",
    "project-subnet",
    "project-usagerecord",
    "project-webhook",
    "sshkey",
    "template",
    "token",
}


@pytest.mark.parametrize("basename", ["admin-auditevent", "project-auditevent", "template"])
def test_the_read_path_answers_404_for_a_key_of_the_wrong_type(client_for, staff, basename):
    """A detail URL whose key cannot be the object's (``/audit-events/null/``) names nothing:
    404, as on DRF's own path, never a 500."""
    project = make_project(owner=staff)
    kwargs = {"project_slug": project.slug} if basename.startswith("project-") else {}
    viewset = _viewset(basename)
    kwarg = viewset.lookup_url_kwarg or viewset.lookup_field
    url = reverse(f"api:{basename}-detail", kwargs={**kwargs, kwarg: "null"})
    response = client_for(staff).get(url)
    assert response.status_code == 404, response.content
