"""/api/v1: every app's endpoints, on three routers.

- ``project_router``: ``projects/{project_slug}/…``, tenant-owned, behind ProjectScopedViewSet.
  The isolation test suite fails when an endpoint registered here has no isolation test.
- ``admin_router``: ``admin/…``, operators only.
- ``user_router``: the caller's own things and the project list.
"""

from django.urls import include, path
from rest_framework.routers import DefaultRouter, SimpleRouter

from compute.api.imagefiles import image_file
from compute.api.metadata import SpotAcknowledgeView, SpotCheckpointView, SpotInstanceActionView
from compute.api.views import (
    LeaseViewSet,
    OperatorCapacityGuaranteeViewSet,
    OperatorDeviceViewSet,
    OperatorHostViewSet,
    OperatorImageViewSet,
    OperatorLeaseViewSet,
    OperatorTemplateViewSet,
    OperatorVirtualMachineViewSet,
    PlacementGroupViewSet,
    ProjectImageViewSet,
    ReclamationViewSet,
    TemplateViewSet,
    VirtualMachineViewSet,
)
from controlplane.api.views import (
    OperatorAuditEventViewSet,
    OperatorOperationViewSet,
    ProjectAuditEventViewSet,
    ProjectEventViewSet,
    ProjectOperationViewSet,
    WebhookViewSet,
)
from network.api.views import (
    ExternalConnectionViewSet,
    GlobalIpViewSet,
    NetworkViewSet,
    OperatorExternalConnectionViewSet,
    OperatorGlobalIpPoolViewSet,
    OperatorHostNetworkViewSet,
    PortForwardViewSet,
    PortViewSet,
    SecurityGroupRuleViewSet,
    SecurityGroupViewSet,
    SubnetViewSet,
)
from storage.api.views import (
    AccessKeyViewSet,
    BucketViewSet,
    OperatorBucketViewSet,
    OperatorShareViewSet,
    OperatorVolumeViewSet,
    ShareViewSet,
    VolumeViewSet,
)
from tenants.api import billing as billing_api
from tenants.api.access import (
    ApplicationViewSet,
    InvitationAcceptView,
    InvitationViewSet,
    OperatorInstitutionReviewerViewSet,
    OperatorUserViewSet,
)
from tenants.api.views import (
    ApiTokenViewSet,
    LoginView,
    LogoutView,
    MemberViewSet,
    MeView,
    OperatorProjectViewSet,
    ProjectViewSet,
    QuotaViewSet,
    SSHKeyViewSet,
)

PROJECT = r"projects/(?P<project_slug>[^/.]+)"

user_router = DefaultRouter()
user_router.register("projects", ProjectViewSet, basename="project")
user_router.register("user/ssh-keys", SSHKeyViewSet, basename="sshkey")
user_router.register("user/tokens", ApiTokenViewSet, basename="token")
user_router.register("templates", TemplateViewSet, basename="template")
user_router.register("applications", ApplicationViewSet, basename="application")

project_router = SimpleRouter()
project_router.register(f"{PROJECT}/members", MemberViewSet, basename="project-member")
project_router.register(f"{PROJECT}/quota", QuotaViewSet, basename="project-quota")
project_router.register(f"{PROJECT}/invitations", InvitationViewSet, basename="project-invitation")
project_router.register(
    f"{PROJECT}/audit-events", ProjectAuditEventViewSet, basename="project-auditevent"
)
project_router.register(
    f"{PROJECT}/operations", ProjectOperationViewSet, basename="project-operation"
)
project_router.register(f"{PROJECT}/events", ProjectEventViewSet, basename="project-event")
project_router.register(f"{PROJECT}/webhooks", WebhookViewSet, basename="project-webhook")
project_router.register(f"{PROJECT}/vms", VirtualMachineViewSet, basename="project-vm")
project_router.register(f"{PROJECT}/images", ProjectImageViewSet, basename="project-image")
project_router.register(
    f"{PROJECT}/placement-groups", PlacementGroupViewSet, basename="project-placementgroup"
)
project_router.register(
    f"{PROJECT}/reclamation", ReclamationViewSet, basename="project-reclamation"
)
project_router.register(f"{PROJECT}/leases", LeaseViewSet, basename="project-lease")
for prefix, viewset, basename in [
    ("networks", NetworkViewSet, "project-network"),
    ("subnets", SubnetViewSet, "project-subnet"),
    ("ports", PortViewSet, "project-port"),
    ("security-groups", SecurityGroupViewSet, "project-securitygroup"),
    ("security-group-rules", SecurityGroupRuleViewSet, "project-securitygrouprule"),
    ("global-ips", GlobalIpViewSet, "project-globalip"),
    ("port-forwards", PortForwardViewSet, "project-portforward"),
    ("external-connections", ExternalConnectionViewSet, "project-externalconnection"),
    ("volumes", VolumeViewSet, "project-volume"),
    ("shares", ShareViewSet, "project-share"),
    ("buckets", BucketViewSet, "project-bucket"),
    ("access-keys", AccessKeyViewSet, "project-accesskey"),
]:
    project_router.register(f"{PROJECT}/{prefix}", viewset, basename=basename)

admin_router = SimpleRouter()
admin_router.register("admin/projects", OperatorProjectViewSet, basename="admin-project")
admin_router.register("admin/users", OperatorUserViewSet, basename="admin-user")
admin_router.register(
    "admin/institution-reviewers",
    OperatorInstitutionReviewerViewSet,
    basename="admin-institutionreviewer",
)
admin_router.register("admin/audit-events", OperatorAuditEventViewSet, basename="admin-auditevent")
admin_router.register("admin/operations", OperatorOperationViewSet, basename="admin-operation")
admin_router.register("admin/hosts", OperatorHostViewSet, basename="admin-host")
admin_router.register("admin/devices", OperatorDeviceViewSet, basename="admin-device")
admin_router.register("admin/templates", OperatorTemplateViewSet, basename="admin-template")
admin_router.register("admin/images", OperatorImageViewSet, basename="admin-image")
admin_router.register("admin/vms", OperatorVirtualMachineViewSet, basename="admin-vm")
admin_router.register("admin/leases", OperatorLeaseViewSet, basename="admin-lease")
admin_router.register(
    "admin/capacity-guarantees",
    OperatorCapacityGuaranteeViewSet,
    basename="admin-capacityguarantee",
)
admin_router.register(
    "admin/global-ip-pools", OperatorGlobalIpPoolViewSet, basename="admin-globalippool"
)
admin_router.register(
    "admin/external-connections",
    OperatorExternalConnectionViewSet,
    basename="admin-externalconnection",
)
admin_router.register(
    "admin/host-networks", OperatorHostNetworkViewSet, basename="admin-hostnetwork"
)
admin_router.register("admin/volumes", OperatorVolumeViewSet, basename="admin-volume")
admin_router.register("admin/shares", OperatorShareViewSet, basename="admin-share")
admin_router.register("admin/buckets", OperatorBucketViewSet, basename="admin-bucket")

# Billing (tenants): a project's usage, invoices, budgets, points and forecast; operators'
# rate cards, invoices and points.
for prefix, viewset, basename in [
    ("usage-records", billing_api.UsageRecordViewSet, "project-usagerecord"),
    ("invoices", billing_api.InvoiceViewSet, "project-invoice"),
    ("budgets", billing_api.BudgetViewSet, "project-budget"),
    ("points", billing_api.PointsEntryViewSet, "project-pointsentry"),
    ("forecast", billing_api.ForecastViewSet, "project-forecast"),
]:
    project_router.register(f"{PROJECT}/{prefix}", viewset, basename=basename)
admin_router.register("admin/rate-cards", billing_api.OperatorRateCardViewSet, "admin-ratecard")
admin_router.register("admin/invoices", billing_api.OperatorInvoiceViewSet, "admin-invoice")
admin_router.register("admin/points", billing_api.OperatorPointsViewSet, "admin-pointsentry")

urlpatterns = [
    path("auth/login/", LoginView.as_view(), name="login"),
    path("auth/logout/", LogoutView.as_view(), name="logout"),
    path("user/", MeView.as_view(), name="me"),
    path("invitations/accept/", InvitationAcceptView.as_view(), name="invitation-accept"),
    path(
        "metadata/spot/instance-action",
        SpotInstanceActionView.as_view(),
        name="metadata-spot-instance-action",
    ),
    path(
        "metadata/spot/acknowledge",
        SpotAcknowledgeView.as_view(),
        name="metadata-spot-acknowledge",
    ),
    path(
        "metadata/spot/checkpoint",
        SpotCheckpointView.as_view(),
        name="metadata-spot-checkpoint",
    ),
    path("image-files/<str:token>", image_file, name="image-file"),
    path("", include(project_router.urls)),
    path("", include(admin_router.urls)),
    path("", include(user_router.urls)),
]
