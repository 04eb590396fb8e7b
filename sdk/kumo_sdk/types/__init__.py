"""Typed results: one frozen dataclass per API resource, one module per area.

``decode(cls, body)`` builds one from a JSON body: timestamps become ``datetime``, dates
``date``, nested objects their dataclass. Fields the server adds later are ignored (an older
SDK keeps working) and are still in ``raw``, the body exactly as the server sent it.
``tests/sdk/test_schema_drift.py`` fails when a type misses a field the API serves, or names
one it does not.
"""

from kumo_sdk.types.base import BEYOND_SCHEMA, decode
from kumo_sdk.types.billing import (
    Budget,
    Forecast,
    ForecastBudget,
    ForecastLine,
    Invoice,
    InvoiceVerification,
    OperatorPointsEntry,
    PointsEntry,
    RateCard,
    RateCardPrice,
    UsageRecord,
)
from kumo_sdk.types.compute import (
    CapacityGuarantee,
    ConsoleTicket,
    Device,
    Host,
    Image,
    Lease,
    Nic,
    PlacementGroup,
    Reclamation,
    ReclamationStep,
    ReclamationThresholds,
    Template,
    VirtualMachine,
)
from kumo_sdk.types.events import (
    AuditEvent,
    Event,
    Operation,
    Webhook,
)
from kumo_sdk.types.network import (
    ExternalConnection,
    GlobalIp,
    GlobalIpPool,
    HostNetwork,
    Network,
    Port,
    PortForward,
    SecurityGroup,
    SecurityGroupRule,
    Subnet,
)
from kumo_sdk.types.storage import (
    AccessKey,
    Bucket,
    Share,
    Volume,
)
from kumo_sdk.types.tenants import (
    ApiToken,
    Member,
    OperatorProject,
    Project,
    Quota,
    QuotaLine,
    SSHKey,
    User,
    UserBrief,
)

__all__ = [
    "BEYOND_SCHEMA",
    "AccessKey",
    "ApiToken",
    "AuditEvent",
    "Bucket",
    "Budget",
    "CapacityGuarantee",
    "ConsoleTicket",
    "Device",
    "Event",
    "ExternalConnection",
    "Forecast",
    "ForecastBudget",
    "ForecastLine",
    "GlobalIp",
    "GlobalIpPool",
    "Host",
    "HostNetwork",
    "Image",
    "Invoice",
    "InvoiceVerification",
    "Lease",
    "Member",
    "Network",
    "Nic",
    "Operation",
    "OperatorPointsEntry",
    "OperatorProject",
    "PlacementGroup",
    "PointsEntry",
    "Port",
    "PortForward",
    "Project",
    "Quota",
    "QuotaLine",
    "RateCard",
    "RateCardPrice",
    "Reclamation",
    "ReclamationStep",
    "ReclamationThresholds",
    "SSHKey",
    "SecurityGroup",
    "SecurityGroupRule",
    "Share",
    "Subnet",
    "Template",
    "UsageRecord",
    "User",
    "UserBrief",
    "VirtualMachine",
    "Volume",
    "Webhook",
    "decode",
]
