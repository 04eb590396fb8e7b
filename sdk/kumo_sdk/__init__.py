"""The Python client of Kumo's REST API, and the ``kumo`` command line (``kumo_sdk.cli``).

from kumo_sdk import Client
with Client("http://127.0.0.1:8000", token, project="demo") as kumo:
    vm = kumo.vms.create("train-1", template="g1-small", image=1, wait=True)
"""

from kumo_sdk.client import Client, mint_token
from kumo_sdk.errors import (
    ApiError,
    AuthenticationFailed,
    Conflict,
    ConnectionFailed,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidState,
    KumoError,
    NoCapacity,
    NotFound,
    NotSupported,
    OperationFailed,
    OperationTimeout,
    PermissionDenied,
    QuotaExceeded,
    ServerError,
    Throttled,
)

__all__ = [
    "ApiError",
    "AuthenticationFailed",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "IdempotencyKeyReused",
    "InvalidInput",
    "InvalidState",
    "KumoError",
    "NoCapacity",
    "NotFound",
    "NotSupported",
    "OperationFailed",
    "OperationTimeout",
    "PermissionDenied",
    "QuotaExceeded",
    "ServerError",
    "Throttled",
    "mint_token",
]
