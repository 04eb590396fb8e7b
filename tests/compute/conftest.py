"""Fixtures shared by compute's tests."""

from tests.compute.test_vms import sent  # noqa: F401 - the messages sent to host agents
