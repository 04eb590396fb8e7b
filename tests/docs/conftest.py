"""The live Kumo of the SDK tests (gunicorn; the controller and a simulated host's agent on
demand), for the README's tour."""

from tests.sdk.conftest import hosts, server  # noqa: F401 (fixtures)
