"""Every API operation a person calls has a portal page that performs it, or a reviewed
reason why not.

The operations are the OpenAPI schema's, generated in-process from the views (as
``tests/sdk/test_schema_drift.py`` does): method and path. Each is either in ``PORTAL``,
naming the portal URL (``portal:<name>``) whose page does it, or in ``NOT_IN_PORTAL`` with
the reason. A new API operation in neither fails; so does a stale entry: an operation the
API no longer has, or a portal URL name that does not exist.
"""

from typing import Any

import pytest
from django.urls import URLPattern, URLResolver
from drf_spectacular.generators import SchemaGenerator

from controlplane.portal import urls as portal_urls

METHODS = ("get", "post", "put", "patch", "delete")
P = "/api/v1/projects/{project_slug}/"
A = "/api/v1/admin/"

# The operation -> the portal URL whose page performs it (lists on the page that shows them,
# a create on the page with its form, an action on its button's URL).
PORTAL = {
    # Projects
    "GET /api/v1/projects/": "portal:home",
    f"GET {P}": "portal:dashboard",
    f"PUT {P}": "portal:project-settings",
    f"PATCH {P}": "portal:project-settings",
    f"DELETE {P}": "portal:project-delete",
    f"GET {P}quota/": "portal:dashboard",
    f"GET {P}forecast/": "portal:billing",
    f"GET {P}reclamation/": "portal:reclamation",
    f"GET {P}audit-events/": "portal:audit",
    f"GET {P}audit-events/{{id}}/": "portal:audit",
    # VMs
    "GET /api/v1/templates/": "portal:vm-create",
    "GET /api/v1/templates/{name}/": "portal:vm-create",
    f"GET {P}vms/": "portal:vms",
    f"POST {P}vms/": "portal:vm-create",
    f"GET {P}vms/{{id}}/": "portal:vm-detail",
    f"DELETE {P}vms/{{id}}/": "portal:vm-action",
    f"POST {P}vms/{{id}}/console/": "portal:vm-console-token",
    f"GET {P}vms/{{id}}/console-log/": "portal:vm-console-log",
    f"POST {P}vms/{{id}}/power-off/": "portal:vm-action",
    f"POST {P}vms/{{id}}/reboot/": "portal:vm-action",
    f"POST {P}vms/{{id}}/reset/": "portal:vm-action",
    f"POST {P}vms/{{id}}/shelve/": "portal:vm-action",
    f"POST {P}vms/{{id}}/start/": "portal:vm-action",
    f"POST {P}vms/{{id}}/stop/": "portal:vm-action",
    f"POST {P}vms/{{id}}/unshelve/": "portal:vm-action",
    f"GET {P}images/": "portal:images",
    f"POST {P}images/": "portal:images",
    f"GET {P}images/{{id}}/": "portal:images",
    f"PUT {P}images/{{id}}/file/": "portal:images",
    f"DELETE {P}images/{{id}}/": "portal:image-delete",
    f"GET {P}placement-groups/": "portal:placement-groups",
    f"POST {P}placement-groups/": "portal:placement-groups",
    f"GET {P}placement-groups/{{id}}/": "portal:placement-groups",
    f"DELETE {P}placement-groups/{{id}}/": "portal:placement-group-delete",
    f"GET {P}leases/": "portal:leases",
    f"POST {P}leases/": "portal:leases",
    f"GET {P}leases/{{id}}/": "portal:leases",
    f"POST {P}leases/{{id}}/cancel/": "portal:lease-cancel",
    f"PATCH {P}leases/{{id}}/": "portal:lease-lending",  # its lending button
    f"GET {P}events/": "portal:events",
    # Network
    f"GET {P}networks/": "portal:networks",
    f"POST {P}networks/": "portal:networks",
    f"GET {P}networks/{{id}}/": "portal:network-detail",
    f"PATCH {P}networks/{{id}}/": "portal:network-detail",  # its outbound form
    f"DELETE {P}networks/{{id}}/": "portal:network-delete",
    f"GET {P}subnets/": "portal:network-detail",
    f"POST {P}subnets/": "portal:network-detail",
    f"GET {P}subnets/{{id}}/": "portal:network-detail",
    f"PATCH {P}subnets/{{id}}/": "portal:subnet-dns",  # the only field a subnet changes
    f"DELETE {P}subnets/{{id}}/": "portal:subnet-delete",
    f"GET {P}ports/": "portal:network-detail",
    f"POST {P}ports/": "portal:network-detail",
    f"GET {P}ports/{{id}}/": "portal:port-security-groups",
    f"PATCH {P}ports/{{id}}/": "portal:port-security-groups",  # its groups and port security
    f"DELETE {P}ports/{{id}}/": "portal:port-delete",
    f"GET {P}security-groups/": "portal:security-groups",
    f"POST {P}security-groups/": "portal:security-groups",
    f"GET {P}security-groups/{{id}}/": "portal:security-group",
    f"DELETE {P}security-groups/{{id}}/": "portal:security-group-delete",
    f"GET {P}security-group-rules/": "portal:security-group",
    f"POST {P}security-group-rules/": "portal:security-group",
    f"GET {P}security-group-rules/{{id}}/": "portal:security-group",
    f"DELETE {P}security-group-rules/{{id}}/": "portal:rule-delete",
    f"GET {P}global-ips/": "portal:global-ips",
    f"POST {P}global-ips/": "portal:global-ips",
    f"GET {P}global-ips/{{id}}/": "portal:global-ips",
    f"DELETE {P}global-ips/{{id}}/": "portal:global-ip-release",
    f"POST {P}global-ips/{{id}}/associate/": "portal:global-ips",
    f"GET {P}port-forwards/": "portal:global-ips",
    f"POST {P}port-forwards/": "portal:global-ips",
    f"GET {P}port-forwards/{{id}}/": "portal:global-ips",
    f"DELETE {P}port-forwards/{{id}}/": "portal:port-forward-delete",
    f"GET {P}external-connections/": "portal:connections",
    f"POST {P}external-connections/": "portal:connections",
    f"GET {P}external-connections/{{id}}/": "portal:connections",
    f"DELETE {P}external-connections/{{id}}/": "portal:connection-delete",
    # Storage
    f"GET {P}volumes/": "portal:storage",
    f"POST {P}volumes/": "portal:storage",
    f"GET {P}volumes/{{id}}/": "portal:storage",
    f"DELETE {P}volumes/{{id}}/": "portal:volume-delete",
    f"POST {P}volumes/{{id}}/attach/": "portal:volume-attach",
    f"POST {P}volumes/{{id}}/detach/": "portal:volume-detach",
    f"POST {P}volumes/{{id}}/extend/": "portal:volume-extend",
    f"POST {P}shares/": "portal:storage",
    f"GET {P}shares/": "portal:storage",
    f"GET {P}shares/{{id}}/": "portal:storage",
    f"DELETE {P}shares/{{id}}/": "portal:share-delete",
    f"POST {P}shares/{{id}}/extend/": "portal:share-extend",
    f"GET {P}buckets/": "portal:storage",
    f"POST {P}buckets/": "portal:storage",
    f"GET {P}buckets/{{name}}/": "portal:storage",
    f"PATCH {P}buckets/{{name}}/": "portal:bucket-quota",  # its one changeable field
    f"DELETE {P}buckets/{{name}}/": "portal:bucket-delete",
    f"GET {P}access-keys/": "portal:storage",
    f"POST {P}access-keys/": "portal:access-key-create",
    f"GET {P}access-keys/{{id}}/": "portal:storage",
    f"DELETE {P}access-keys/{{id}}/": "portal:access-key-delete",
    # Webhooks
    f"GET {P}webhooks/": "portal:webhooks",
    f"POST {P}webhooks/": "portal:webhooks",
    f"GET {P}webhooks/{{id}}/": "portal:webhooks",
    f"DELETE {P}webhooks/{{id}}/": "portal:webhook-delete",
    # People
    f"GET {P}members/": "portal:members",
    f"GET {P}members/{{username}}/": "portal:members",
    f"PATCH {P}members/{{username}}/": "portal:member-role",
    f"DELETE {P}members/{{username}}/": "portal:member-remove",
    f"GET {P}invitations/": "portal:members",
    f"POST {P}invitations/": "portal:members",
    f"GET {P}invitations/{{id}}/": "portal:members",
    f"DELETE {P}invitations/{{id}}/": "portal:invitation-revoke",
    "POST /api/v1/invitations/accept/": "portal:invitation",
    # Billing
    f"GET {P}invoices/": "portal:billing",
    f"GET {P}invoices/{{id}}/": "portal:billing",
    f"GET {P}invoices/{{id}}/csv/": "portal:invoice-csv",
    f"GET {P}invoices/{{id}}/json/": "portal:invoice-json",
    f"GET {P}invoices/{{id}}/verify/": "portal:invoice-verify",
    f"GET {P}budgets/": "portal:billing",
    f"POST {P}budgets/": "portal:billing",
    f"GET {P}budgets/{{id}}/": "portal:billing",
    f"PATCH {P}budgets/{{id}}/": "portal:budget-edit",
    f"DELETE {P}budgets/{{id}}/": "portal:budget-delete",
    f"GET {P}points/": "portal:billing",
    f"GET {P}points/{{id}}/": "portal:billing",
    # The caller's own
    "GET /api/v1/user/": "portal:account",
    "GET /api/v1/user/ssh-keys/": "portal:ssh-keys",
    "POST /api/v1/user/ssh-keys/": "portal:ssh-keys",
    "GET /api/v1/user/ssh-keys/{id}/": "portal:ssh-keys",
    "DELETE /api/v1/user/ssh-keys/{id}/": "portal:ssh-key-delete",
    "GET /api/v1/user/tokens/": "portal:tokens",
    "POST /api/v1/user/tokens/": "portal:tokens",
    "GET /api/v1/user/tokens/{id}/": "portal:tokens",
    "DELETE /api/v1/user/tokens/{id}/": "portal:token-revoke",
    # Applications (applicants and their institution's reviewers)
    "GET /api/v1/applications/": "portal:applications",
    "POST /api/v1/applications/": "portal:applications",
    "GET /api/v1/applications/{id}/": "portal:applications",
    "PATCH /api/v1/applications/{id}/": "portal:application-amend",
    "POST /api/v1/applications/{id}/review/": "portal:application-review",
    "POST /api/v1/applications/{id}/withdraw/": "portal:application-withdraw",
    # Operators (/fleet/)
    f"GET {A}hosts/": "portal:fleet",
    f"GET {A}hosts/{{name}}/": "portal:fleet",
    f"POST {A}hosts/{{name}}/state/": "portal:host-state",
    f"GET {A}devices/": "portal:fleet",  # the GPU grid: one cell a device
    f"GET {A}projects/": "portal:fleet-projects",
    f"GET {A}projects/{{slug}}/": "portal:fleet-projects",
    f"GET {A}projects/{{slug}}/quota/": "portal:project-quota",
    f"PATCH {A}projects/{{slug}}/quota/": "portal:project-quota",
    f"GET {A}external-connections/": "portal:fleet-connections",
    f"GET {A}external-connections/{{id}}/": "portal:fleet-connections",
    f"POST {A}external-connections/{{id}}/approve/": "portal:connection-review",
    f"POST {A}external-connections/{{id}}/reject/": "portal:connection-review",
    f"GET {A}leases/": "portal:fleet-leases",
    f"GET {A}leases/{{id}}/": "portal:fleet-leases",
    f"POST {A}leases/{{id}}/cancel/": "portal:fleet-lease-cancel",
    f"PATCH {A}leases/{{id}}/": "portal:fleet-lease-lending",
    f"GET {A}users/": "portal:users",
    f"GET {A}users/{{username}}/": "portal:users",
    f"POST {A}users/{{username}}/deactivate/": "portal:user-deactivate",
    f"POST {A}users/{{username}}/reactivate/": "portal:user-reactivate",
}

ADMIN_CONSOLE = "operators do it in the admin console (/admin/, Kumo operations)"
CLI = "not built in the portal yet: use the CLI or the API"

# Operations with no portal page, each with its reason. Reviewed: add to it only with one.
NOT_IN_PORTAL = {
    # Not called by people in a browser.
    "GET /api/v1/metadata/spot/instance-action": "called by a guest with its metadata token",
    "POST /api/v1/metadata/spot/acknowledge": "called by a guest with its metadata token",
    "POST /api/v1/metadata/spot/checkpoint": "called by a guest with its metadata token",
    "POST /api/v1/auth/login/": "the CLI's session for minting a token; the portal has its own "
    "log-in page (portal:login)",
    "POST /api/v1/auth/logout/": "the CLI's session; the portal logs out at portal:logout",
    # A member's or an admin's, not in the portal yet.
    "POST /api/v1/projects/": "projects are made by approving an application "
    "(portal:applications); making one outright is the operators' (admin console, API)",
    f"GET {P}events/{{id}}/": f"one event on its own: {CLI}",
    f"GET {P}operations/": "an operation's progress shows on its object's page (a VM's state "
    f"polls); the list of operations: {CLI}",
    f"GET {P}operations/{{id}}/": f"shown as the object's state, not on its own: {CLI}",
    f"GET {P}usage-records/": f"the dashboard and billing show usage summed; raw: {CLI}",
    f"GET {P}usage-records/{{id}}/": f"raw usage records: {CLI}",
    # Operators': the admin console, or the CLI.
    f"GET {A}audit-events/": ADMIN_CONSOLE,
    f"GET {A}audit-events/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}buckets/": ADMIN_CONSOLE,
    f"GET {A}buckets/{{name}}/": ADMIN_CONSOLE,
    f"GET {A}capacity-guarantees/": ADMIN_CONSOLE,
    f"GET {A}capacity-guarantees/{{project}}/": ADMIN_CONSOLE,
    f"PUT {A}capacity-guarantees/{{project}}/": ADMIN_CONSOLE,
    f"GET {A}devices/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}global-ip-pools/": ADMIN_CONSOLE,
    f"POST {A}global-ip-pools/": ADMIN_CONSOLE,
    f"GET {A}global-ip-pools/{{id}}/": ADMIN_CONSOLE,
    f"DELETE {A}global-ip-pools/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}host-networks/": ADMIN_CONSOLE,
    f"GET {A}host-networks/{{host}}/": ADMIN_CONSOLE,
    f"POST {A}host-networks/{{host}}/resync/": f"{ADMIN_CONSOLE}: Host networks, resend desired",
    f"PATCH {A}hosts/{{name}}/": ADMIN_CONSOLE,
    f"POST {A}hosts/{{name}}/ping/": f"{ADMIN_CONSOLE}: Hosts, ping",
    f"POST {A}hosts/{{name}}/guests/": "asking a host's libvirt for its guests: "
    "`kumo admin host guests`",
    f"GET {A}images/": ADMIN_CONSOLE,
    f"POST {A}images/": ADMIN_CONSOLE,
    f"GET {A}images/{{id}}/": ADMIN_CONSOLE,
    f"DELETE {A}images/{{id}}/": ADMIN_CONSOLE,
    f"PUT {A}images/{{id}}/file/": "uploading a public image's file (gigabytes): "
    "`kumo admin image upload`",
    f"GET {A}institution-reviewers/": ADMIN_CONSOLE,
    f"POST {A}institution-reviewers/": ADMIN_CONSOLE,
    f"GET {A}institution-reviewers/{{id}}/": ADMIN_CONSOLE,
    f"DELETE {A}institution-reviewers/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}invoices/": ADMIN_CONSOLE,
    f"GET {A}invoices/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}invoices/{{id}}/csv/": "any project's invoice as CSV: `kumo admin invoice download`",
    f"GET {A}invoices/{{id}}/json/": "any project's signed invoice: "
    "`kumo admin invoice download --format json`",
    f"GET {A}invoices/{{id}}/verify/": f"{ADMIN_CONSOLE}: Invoices, verify",
    f"POST {A}invoices/issue/": f"{ADMIN_CONSOLE} (Projects, issue last month's); another "
    "period: `kumo admin invoice issue`",
    f"GET {A}operations/": ADMIN_CONSOLE,
    f"GET {A}operations/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}points/": ADMIN_CONSOLE,
    f"POST {A}points/": f"{ADMIN_CONSOLE}: Points entries, add",
    f"POST {A}projects/": ADMIN_CONSOLE,
    f"PUT {A}projects/{{slug}}/": ADMIN_CONSOLE,
    f"PATCH {A}projects/{{slug}}/": ADMIN_CONSOLE,
    f"GET {A}rate-cards/": ADMIN_CONSOLE,
    f"POST {A}rate-cards/": ADMIN_CONSOLE,
    f"GET {A}rate-cards/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}shares/": ADMIN_CONSOLE,
    f"GET {A}shares/{{id}}/": ADMIN_CONSOLE,
    f"GET {A}templates/": ADMIN_CONSOLE,
    f"POST {A}templates/": ADMIN_CONSOLE,
    f"GET {A}templates/{{name}}/": ADMIN_CONSOLE,
    f"PATCH {A}templates/{{name}}/": ADMIN_CONSOLE,
    f"POST {A}users/": ADMIN_CONSOLE,
    f"GET {A}vms/": ADMIN_CONSOLE,
    f"GET {A}vms/{{id}}/": ADMIN_CONSOLE,
    f"POST {A}vms/{{id}}/describe/": "asking a VM's host for its libvirt domain: "
    "`kumo admin vm describe`",
    f"GET {A}volumes/": ADMIN_CONSOLE,
    f"GET {A}volumes/{{id}}/": ADMIN_CONSOLE,
}


@pytest.fixture(scope="module")
def operations() -> set[str]:
    schema: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    return {
        f"{method.upper()} {path}"
        for path, item in schema["paths"].items()
        for method in item
        if method in METHODS
    }


def portal_url_names() -> set[str]:
    """Every named URL of the portal (``controlplane.portal.urls``, includes walked)."""
    names = set()

    def walk(patterns):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns)
            elif isinstance(pattern, URLPattern) and pattern.name:
                names.add(f"{portal_urls.app_name}:{pattern.name}")

    walk(portal_urls.urlpatterns)
    return names


def test_every_api_operation_has_a_portal_page_or_a_reason(operations):
    missing = sorted(operations - set(PORTAL) - set(NOT_IN_PORTAL))
    assert not missing, (
        "API operations with no portal page: add the page and name it in PORTAL, or give "
        f"the reason in NOT_IN_PORTAL: {missing}"
    )


def test_no_entry_names_an_operation_the_api_does_not_have(operations):
    stale = sorted((set(PORTAL) | set(NOT_IN_PORTAL)) - operations)
    assert not stale, f"entries for operations the API no longer has: {stale}"


def test_every_named_portal_page_exists():
    names = portal_url_names()
    assert "portal:vm-create" in names, "the walk of the portal's URLs found nothing"
    stale = sorted({f"{op} -> {name}" for op, name in PORTAL.items() if name not in names})
    assert not stale, f"portal URL names that do not exist: {stale}"


def test_an_operation_is_either_mapped_or_excused_not_both():
    both = sorted(set(PORTAL) & set(NOT_IN_PORTAL))
    assert not both, f"both in PORTAL and NOT_IN_PORTAL: {both}"
    assert all(reason.strip() for reason in NOT_IN_PORTAL.values())
