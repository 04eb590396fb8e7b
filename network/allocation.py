"""Allocating VNIs, MACs, fixed IPs and global IPs.

Each value is made unique by a database constraint; the allocator picks the lowest free
value it can see and inserts it inside a savepoint. Should a concurrent transaction have
taken it first, the insert fails on the constraint and the next free value is tried, so
no value is ever handed out twice and nobody waits on a lock. Exhaustion raises Conflict
(409) naming the pool.
"""

import ipaddress
import secrets
from collections.abc import Callable, Iterable, Iterator

from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.errors import Conflict

ATTEMPTS = 32


def claim(candidates: Iterable, create: Callable, *, exhausted: str, code: str = "exhausted"):
    """Try ``create(value)`` for each candidate in turn inside a savepoint until one
    insert holds; a unique-constraint failure means someone took that value first."""
    for value in candidates:
        try:
            with transaction.atomic():
                return create(value)
        except IntegrityError:
            continue
    raise Conflict(exhausted, code=code, details={"pool": [exhausted]})


def free_vnis(taken: set[int]) -> Iterator[int]:
    first, last = settings.VNI_RANGE
    for vni in range(first, last + 1):
        if vni not in taken:
            yield vni


def random_macs() -> Iterator[str]:
    """MACs under ``KUMO_MAC_PREFIX`` at random: collisions only cost a retry."""
    for _ in range(ATTEMPTS):
        tail = secrets.token_bytes(3)
        yield settings.MAC_PREFIX + "".join(f":{b:02x}" for b in tail)


def free_addresses(start: str, end: str, taken: set[str], *, skip=()) -> Iterator[str]:
    """Addresses from ``start`` to ``end`` (inclusive) not in ``taken`` or ``skip``."""
    low, high = int(ipaddress.IPv4Address(start)), int(ipaddress.IPv4Address(end))
    excluded = taken | {a for a in skip if a}
    for value in range(low, high + 1):
        address = str(ipaddress.IPv4Address(value))
        if address not in excluded:
            yield address
