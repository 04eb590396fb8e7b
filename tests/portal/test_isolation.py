"""Tenant isolation in the portal: every page or form of ``/p/<slug>/`` that names one object
answers 404 for another project's object, exactly as for one that does not exist, and a
form posted at it changes nothing. The objects are made as the API's isolation contracts
make them; ``test_every_portal_view_of_an_object_is_covered`` fails for a view left out."""

import re
import uuid

import pytest
from django.urls import URLPattern, reverse

import tests.compute.test_api_isolation as compute_contracts
import tests.controlplane.test_events as event_contracts
import tests.network.test_api_isolation as network_contracts
import tests.storage.test_api_isolation as storage_contracts
import tests.tenants.test_billing_api as billing_contracts
import tests.tenants.test_invitations as invitation_contracts
from compute.models import Host
from controlplane.portal.urls import project_urls
from storage import services as storage_services
from storage.drivers.fake import FakeObjectStore
from tenants import services as tenants
from tenants.models import Invitation, Membership, User
from tests.factories import UserFactory, add_member, make_host, make_vm


def _vm(project):
    tenants.quota_set(project=project, vcpus=64, memory_gib=256, gpus=0, vms=8)
    return make_vm(project)


def _member(project):
    return add_member(project, UserFactory())


def _contract(cls):
    return lambda project: cls().make_object(project)


def _share(project):
    """A share on tier ``fast``, whose server (mds-01) is enrolled once."""
    if not Host.objects.filter(name="mds-01").exists():
        make_host("mds-01", kind="cpu")
    return storage_contracts.TestShareIsolation().make_object(project)


# URL name -> (HTTP method, how to make one object in a project, extra URL kwargs)
CASES = {
    "vm-detail": ("get", _vm, {}),
    "vm-state": ("get", _vm, {}),
    "vm-console-log": ("get", _vm, {}),
    "vm-console": ("get", _vm, {}),
    "vm-console-token": ("post", _vm, {}),
    "vm-action": ("post", _vm, {"action": "stop"}),
    "network-delete": ("post", _contract(network_contracts.TestNetworkIsolation), {}),
    "subnet-dns": ("post", _contract(network_contracts.TestSubnetIsolation), {}),
    "security-group": ("get", _contract(network_contracts.TestSecurityGroupIsolation), {}),
    "security-group-delete": (
        "post",
        _contract(network_contracts.TestSecurityGroupIsolation),
        {},
    ),
    "rule-delete": ("post", _contract(network_contracts.TestSecurityGroupRuleIsolation), {}),
    "global-ip-release": ("post", _contract(network_contracts.TestGlobalIpIsolation), {}),
    "port-forward-delete": (
        "post",
        _contract(network_contracts.TestPortForwardIsolation),
        {},
    ),
    "network-detail": ("get", _contract(network_contracts.TestNetworkIsolation), {}),
    "subnet-delete": ("post", _contract(network_contracts.TestSubnetIsolation), {}),
    "port-delete": ("post", _contract(network_contracts.TestPortIsolation), {}),
    "port-security-groups": ("post", _contract(network_contracts.TestPortIsolation), {}),
    "global-ip-disassociate": ("post", _contract(network_contracts.TestGlobalIpIsolation), {}),
    "connection-delete": (
        "post",
        _contract(network_contracts.TestExternalConnectionIsolation),
        {},
    ),
    "webhook-delete": ("post", _contract(event_contracts.TestWebhookIsolation), {}),
    "image-delete": ("post", _contract(compute_contracts.TestProjectImageIsolation), {}),
    "volume-delete": ("post", _contract(storage_contracts.TestVolumeIsolation), {}),
    "bucket-delete": ("post", _contract(storage_contracts.TestBucketIsolation), {}),
    "bucket-quota": ("post", _contract(storage_contracts.TestBucketIsolation), {}),
    "share-delete": ("post", _share, {}),
    "share-extend": ("post", _share, {}),
    "volume-attach": ("post", _contract(storage_contracts.TestVolumeIsolation), {}),
    "volume-detach": ("post", _contract(storage_contracts.TestVolumeIsolation), {}),
    "volume-extend": ("post", _contract(storage_contracts.TestVolumeIsolation), {}),
    "access-key-delete": ("post", _contract(storage_contracts.TestAccessKeyIsolation), {}),
    "placement-group-delete": (
        "post",
        _contract(compute_contracts.TestPlacementGroupIsolation),
        {},
    ),
    "lease-cancel": ("post", _contract(compute_contracts.TestLeaseIsolation), {}),
    "lease-lending": ("post", _contract(compute_contracts.TestLeaseIsolation), {}),
    "lease-change": ("post", _contract(compute_contracts.TestLeaseIsolation), {}),
    "member-role": ("post", _member, {}),
    "member-remove": ("post", _member, {}),
    "invitation-revoke": ("post", _contract(invitation_contracts.TestInvitationsIsolation), {}),
    "invoice-csv": ("get", _contract(billing_contracts.TestInvoiceIsolation), {}),
    "invoice-json": ("get", _contract(billing_contracts.TestInvoiceIsolation), {}),
    "invoice-verify": ("get", _contract(billing_contracts.TestInvoiceIsolation), {}),
    "budget-edit": ("get", _contract(billing_contracts.TestBudgetIsolation), {}),
    "budget-delete": ("post", _contract(billing_contracts.TestBudgetIsolation), {}),
}


def _object_views() -> set[str]:
    """The project's portal views whose URL names one object (a parameter beside the slug)."""
    names = set()
    for pattern in project_urls:
        assert isinstance(pattern, URLPattern)
        if pattern.pattern.regex.groupindex.keys() - {"action"}:
            names.add(pattern.name)
    return names


def test_every_portal_view_of_an_object_is_covered():
    assert _object_views() == set(CASES)


CSRF = re.compile(rb'("X-CSRFToken": "|name="csrfmiddlewaretoken" value=")[^"]*')


# The language switch returns to the page asked for: its own path, not the object's.
NEXT = re.compile(rb'(name="next" value=")[^"]*"')


def _page(response) -> bytes:
    """The page without its CSRF tokens (masked afresh in every answer) and the path the
    language switch returns to (the URL asked for)."""
    return NEXT.sub(rb"\1", CSRF.sub(rb"\1", response.content))


def _key(obj) -> dict:
    if isinstance(obj, User):  # a member: named by username
        return {"username": obj.username}
    return {"pk": obj.pk}


def _still_there(obj, project) -> bool:
    if isinstance(obj, User):
        return Membership.objects.filter(project=project, user=obj).exists()
    if isinstance(obj, Invitation):  # revoking keeps the row: still pending
        return Invitation.objects.filter(pk=obj.pk, status=Invitation.Status.PENDING).exists()
    return type(obj).objects.filter(pk=obj.pk).exists()


def _missing(obj) -> dict:
    if isinstance(obj, User):
        return {"username": "nobody-here"}
    return {"pk": uuid.uuid4() if isinstance(obj.pk, uuid.UUID) else 999_999_999}


@pytest.fixture(autouse=True)
def _object_store(monkeypatch, settings):
    store = FakeObjectStore()
    monkeypatch.setattr(storage_services, "object_store", lambda: store)
    settings.SHARE_TIERS = {"fast": {"backend": "lustre", "host": "mds-01", "source": "m:/fast"}}


@pytest.mark.parametrize("name", sorted(CASES))
def test_another_projects_object_is_not_there(name, login, project, other_project):
    method, make, extra = CASES[name]
    theirs = make(other_project)
    mine = make(project)  # the view works for the project's own object (not a blanket 404)
    client = login(project.owner)

    def call(key):
        url = reverse(f"portal:{name}", kwargs={"slug": project.slug, **key, **extra})
        return getattr(client, method)(url, follow=False)

    missing = call(_missing(theirs))
    response = call(_key(theirs))
    assert missing.status_code == 404, missing.content[:300]
    assert response.status_code == 404, response.content[:300]
    assert _page(response) == _page(missing)
    assert _still_there(theirs, other_project)  # a form posted at it changed nothing
    assert call(_key(mine)).status_code != 404
