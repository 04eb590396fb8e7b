"""In-memory storage drivers that keep the same contract as the real ones, for tests of the
code above them. ``fail_next`` makes the next call raise ``StorageError``."""

from __future__ import annotations

from storage.drivers.base import (
    GIB,
    KeyPair,
    ObjectStoreAdmin,
    PoolDriver,
    PoolSpec,
    ShareDriver,
    ShareSpec,
    ShareUsage,
    StorageError,
    VolumeInfo,
    VolumeSpec,
)


class _Failing:
    fail_next: str = ""

    def _maybe_fail(self) -> None:
        if self.fail_next:
            message, self.fail_next = self.fail_next, ""
            raise StorageError(message)


class FakePoolDriver(_Failing, PoolDriver):
    def __init__(self) -> None:
        self.pools: dict[str, dict[str, int]] = {}

    def ensure_pool(self, pool: PoolSpec) -> None:
        self._maybe_fail()
        self.pools.setdefault(pool.name, {})

    def _pool(self, name: str) -> dict[str, int]:
        if name not in self.pools:
            raise StorageError(f"storage pool {name} is not defined on this host")
        return self.pools[name]

    def ensure_volume(self, spec: VolumeSpec) -> VolumeInfo:
        self._maybe_fail()
        pool = self._pool(spec.pool)
        pool[spec.name] = max(pool.get(spec.name, 0), spec.capacity_gib * GIB)
        return VolumeInfo(spec.pool, spec.name, pool[spec.name], f"/{spec.pool}/{spec.name}")

    def ensure_volume_absent(self, pool: str, name: str) -> None:
        self._maybe_fail()
        self.pools.get(pool, {}).pop(name, None)

    def list_volumes(self, pool: str) -> list[VolumeInfo]:
        return [
            VolumeInfo(pool, name, size, f"/{pool}/{name}")
            for name, size in sorted(self._pool(pool).items())
        ]


class FakeShareDriver(_Failing, ShareDriver):
    def __init__(self) -> None:
        self.shares: dict[str, ShareUsage] = {}

    def ensure_share(self, spec: ShareSpec) -> ShareUsage:
        self._maybe_fail()
        used = self.shares[spec.name].used_bytes if spec.name in self.shares else 0
        self.shares[spec.name] = ShareUsage(spec.name, used, spec.quota_gib * GIB)
        return self.shares[spec.name]

    def ensure_share_absent(self, spec: ShareSpec) -> None:
        self._maybe_fail()
        self.shares.pop(spec.name, None)

    def usage(self, spec: ShareSpec) -> ShareUsage:
        if spec.name not in self.shares:
            raise StorageError(f"share {spec.name} does not exist")
        return self.shares[spec.name]


class FakeObjectStore(_Failing, ObjectStoreAdmin):
    enforces_quota = True

    def __init__(self) -> None:
        self.users: dict[str, set[str]] = {}
        self.buckets: dict[str, str] = {}
        self.quotas: dict[str, int] = {}
        self.usage: dict[str, int] = {}
        self._n = 0

    def ensure_user(self, user: str) -> None:
        self._maybe_fail()
        self.users.setdefault(user, set())

    def delete_user(self, user: str) -> None:
        self._maybe_fail()
        self.users.pop(user, None)

    def create_key(self, user: str) -> KeyPair:
        self._maybe_fail()
        if user not in self.users:
            raise StorageError(f"no user {user}")
        self._n += 1
        key = KeyPair(f"FAKEKEY{self._n:013d}", f"secret-{self._n}")
        self.users[user].add(key.access_key_id)
        return key

    def delete_key(self, user: str, access_key_id: str) -> None:
        self._maybe_fail()
        self.users.get(user, set()).discard(access_key_id)

    def ensure_bucket(self, bucket: str, owner: str) -> None:
        self._maybe_fail()
        if self.buckets.setdefault(bucket, owner) != owner:
            raise StorageError(f"bucket {bucket} belongs to someone else")

    def delete_bucket(self, bucket: str, owner: str) -> None:
        self._maybe_fail()
        self.buckets.pop(bucket, None)
        self.quotas.pop(bucket, None)

    def set_bucket_quota(self, bucket: str, owner: str, max_bytes: int) -> None:
        self._maybe_fail()
        self.quotas[bucket] = max_bytes

    def bucket_usage(self, bucket: str) -> int:
        if bucket not in self.buckets:
            raise StorageError(f"no bucket {bucket}")
        return self.usage.get(bucket, 0)
