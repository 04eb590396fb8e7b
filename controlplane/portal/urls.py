"""The web portal: server-rendered pages over the same services and selectors as the API.

A project's pages live under ``/p/<slug>/``; the caller's own keys and tokens under
``/account/``; the operators' fleet view at ``/fleet/``."""

from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from controlplane.portal.views import (
    applications,
    audit,
    auth,
    billing,
    fleet,
    images,
    leases,
    network,
    operators,
    people,
    placement_groups,
    projects,
    reclamation,
    storage,
    users,
    vms,
    webhooks,
)
from tenants.federation import saml

app_name = "portal"

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

project_urls = [
    path("", projects.dashboard, name="dashboard"),
    path("vms/", vms.vm_list, name="vms"),
    path("vms/rows/", vms.vm_rows, name="vm-rows"),
    path("vms/new/", vms.vm_create, name="vm-create"),
    path("vms/<uuid:pk>/", vms.vm_detail, name="vm-detail"),
    path("vms/<uuid:pk>/state/", vms.vm_state, name="vm-state"),
    path("vms/<uuid:pk>/console-log/", vms.vm_console_log, name="vm-console-log"),
    path("vms/<uuid:pk>/console/", vms.vm_console, name="vm-console"),
    path("vms/<uuid:pk>/console/token/", vms.vm_console_token, name="vm-console-token"),
    re_path(
        rf"^vms/(?P<pk>{UUID})/(?P<action>{'|'.join(vms.ACTIONS)})/$",
        vms.vm_action,
        name="vm-action",
    ),
    path("networks/", network.networks, name="networks"),
    path("networks/<uuid:pk>/delete/", network.network_delete, name="network-delete"),
    path("subnets/<int:pk>/dns/", network.subnet_dns, name="subnet-dns"),
    path("security-groups/", network.security_groups, name="security-groups"),
    path("security-groups/<int:pk>/", network.security_group_detail, name="security-group"),
    path(
        "security-groups/<int:pk>/delete/",
        network.security_group_delete,
        name="security-group-delete",
    ),
    path("security-group-rules/<int:pk>/delete/", network.rule_delete, name="rule-delete"),
    path("global-ips/", network.global_ips, name="global-ips"),
    path("global-ips/<int:pk>/release/", network.global_ip_release, name="global-ip-release"),
    path("port-forwards/<int:pk>/delete/", network.port_forward_delete, name="port-forward-delete"),
    path("networks/<uuid:pk>/", network.network_detail, name="network-detail"),
    path("subnets/<int:pk>/delete/", network.subnet_delete, name="subnet-delete"),
    path("ports/<uuid:pk>/delete/", network.port_delete, name="port-delete"),
    path(
        "global-ips/<int:pk>/disassociate/",
        network.global_ip_disassociate,
        name="global-ip-disassociate",
    ),
    path("connections/", network.connections, name="connections"),
    path("connections/<int:pk>/delete/", network.connection_delete, name="connection-delete"),
    path("webhooks/", webhooks.webhooks, name="webhooks"),
    path("webhooks/<int:pk>/delete/", webhooks.webhook_delete, name="webhook-delete"),
    path("settings/", projects.project_settings, name="project-settings"),
    path("images/", images.images, name="images"),
    path("images/<int:pk>/delete/", images.image_delete, name="image-delete"),
    path("storage/", storage.storage, name="storage"),
    path("volumes/<uuid:pk>/delete/", storage.volume_delete, name="volume-delete"),
    path("shares/<uuid:pk>/delete/", storage.share_delete, name="share-delete"),
    path("shares/<uuid:pk>/extend/", storage.share_extend, name="share-extend"),
    path("buckets/<int:pk>/delete/", storage.bucket_delete, name="bucket-delete"),
    path("volumes/<uuid:pk>/attach/", storage.volume_attach, name="volume-attach"),
    path("volumes/<uuid:pk>/detach/", storage.volume_detach, name="volume-detach"),
    path("volumes/<uuid:pk>/extend/", storage.volume_extend, name="volume-extend"),
    path("access-keys/", storage.access_key_create, name="access-key-create"),
    path("access-keys/<int:pk>/delete/", storage.access_key_delete, name="access-key-delete"),
    path("placement-groups/", placement_groups.placement_groups, name="placement-groups"),
    path(
        "placement-groups/<int:pk>/delete/",
        placement_groups.placement_group_delete,
        name="placement-group-delete",
    ),
    path("reclamation/", reclamation.reclamation, name="reclamation"),
    path("leases/", leases.leases, name="leases"),
    path("leases/<int:pk>/cancel/", leases.lease_cancel, name="lease-cancel"),
    path("members/", people.members, name="members"),
    path("members/<str:username>/role/", people.member_role, name="member-role"),
    path("members/<str:username>/remove/", people.member_remove, name="member-remove"),
    path("invitations/<int:pk>/revoke/", people.invitation_revoke, name="invitation-revoke"),
    path("billing/", billing.billing, name="billing"),
    path("billing/invoices/<int:pk>.csv", billing.invoice_csv, name="invoice-csv"),
    path("billing/invoices/<int:pk>.json", billing.invoice_json, name="invoice-json"),
    path("billing/budgets/<int:pk>/delete/", billing.budget_delete, name="budget-delete"),
    path("audit/", audit.audit_log, name="audit"),
]

urlpatterns = [
    path("login/", auth.LoginView.as_view(), name="login"),
    path("login/institution/", saml.discovery, name="discovery"),
    path("login/verify/", auth.login_verify, name="login-verify"),
    path("account/", auth.account, name="account"),
    path("invitations/<str:secret>/", auth.invitation, name="invitation"),
    path("applications/", applications.application_list, name="applications"),
    path(
        "applications/<int:pk>/review/", applications.application_review, name="application-review"
    ),
    path("applications/<int:pk>/amend/", applications.application_amend, name="application-amend"),
    path(
        "applications/<int:pk>/withdraw/",
        applications.application_withdraw,
        name="application-withdraw",
    ),
    path("account/second-factor/", auth.totp_setup, name="totp-setup"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", projects.home, name="home"),
    path("switch/", projects.switch, name="switch"),
    path("p/<slug:slug>/", include(project_urls)),
    path("fleet/leases/", leases.fleet_leases, name="fleet-leases"),
    path("fleet/leases/<int:pk>/cancel/", leases.fleet_lease_cancel, name="fleet-lease-cancel"),
    path("account/ssh-keys/", people.ssh_keys, name="ssh-keys"),
    path("account/ssh-keys/<int:pk>/delete/", people.ssh_key_delete, name="ssh-key-delete"),
    path("account/tokens/", people.tokens, name="tokens"),
    path("account/tokens/<int:pk>/revoke/", people.token_revoke, name="token-revoke"),
    path("fleet/", fleet.fleet, name="fleet"),
    path("fleet/hosts/<slug:name>/state/", fleet.host_state, name="host-state"),
    path("fleet/projects/", operators.project_list, name="fleet-projects"),
    path("fleet/projects/<slug:slug>/quota/", operators.project_quota, name="project-quota"),
    path("fleet/connections/", operators.connection_list, name="fleet-connections"),
    re_path(
        r"^fleet/connections/(?P<pk>[0-9]+)/(?P<verdict>approve|reject)/$",
        operators.connection_review,
        name="connection-review",
    ),
    path("fleet/users/", users.user_list, name="users"),
    path("fleet/users/<str:username>/deactivate/", users.user_deactivate, name="user-deactivate"),
    path("fleet/users/<str:username>/reactivate/", users.user_reactivate, name="user-reactivate"),
]
