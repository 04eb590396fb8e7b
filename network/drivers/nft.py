"""The one module that writes nftables for the host network driver.

A Kumo table is always written whole: ``Nftables.apply`` replaces each table that differs in
one ``nft`` transaction (create, delete, then the table with every chain and rule), so the
kernel never holds half a ruleset, and a table that is already as rendered costs no write.
The digest of a table's rendered text lives in the table's comment and is compared before
anything is written. One transaction counts one write (``writes``, added to a resync's).

nftables is driven through ``libnftables`` (Debian's ``nftables`` package) over ctypes, in
process: its netlink socket is opened inside the namespace the ``Nftables`` is for, so no
``ip netns exec`` and no subprocess per call. nft's own message becomes
``NetworkDriverError``.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
from dataclasses import dataclass

from network.drivers.base import NetworkDriverError
from network.drivers.netlink import netns_entered

_COMMENT_PREFIX = "kumo:"


@dataclass(frozen=True)
class Table:
    """One nftables table: ``body`` is its chains and rules in nft's syntax."""

    family: str
    name: str
    body: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.body.encode()).hexdigest()[:32]

    def render(self) -> str:
        comment = f"{_COMMENT_PREFIX}{self.digest}"
        return f'table {self.family} {self.name} {{\ncomment "{comment}"\n{self.body}\n}}\n'


def _load_libnftables():
    """libnftables with its signatures declared; None when it is not installed."""
    try:
        lib = ctypes.CDLL("libnftables.so.1")
    except OSError:
        return None
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


class Nftables:
    """nftables of one namespace (the caller's own when ``netns`` is empty). Without
    libnftables every call but ``delete`` raises ``NetworkDriverError``."""

    def __init__(self, netns: str = "") -> None:
        self.netns = netns
        self.writes = 0
        self._lib = _load_libnftables()
        self._ctx = None
        if self._lib is not None:
            with netns_entered(netns):
                self._ctx = self._lib.nft_ctx_new(0)
            self._lib.nft_ctx_buffer_output(self._ctx)
            self._lib.nft_ctx_buffer_error(self._ctx)

    def close(self) -> None:
        if self._ctx:
            self._lib.nft_ctx_free(self._ctx)
            self._ctx = None

    def _run(self, command: str) -> tuple[int, str, str]:
        if self._ctx is None:
            raise NetworkDriverError("libnftables is missing (apt-get install nftables)")
        rc = self._lib.nft_run_cmd_from_buffer(self._ctx, command.encode())
        out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode()
        err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode()
        return rc, out, err

    def digest(self, family: str, name: str) -> str | None:
        """The digest a Kumo table was written with; None when the table is missing (or
        was not written by ``apply``)."""
        rc, out, err = self._run(f"list table {family} {name}")
        if rc:
            if "No such file or directory" in err:
                return None
            raise NetworkDriverError(f"list table {family} {name}: {err.strip()}")
        found = re.search(rf'comment "{_COMMENT_PREFIX}([0-9a-f]+)"', out)
        return found.group(1) if found else None

    def apply(self, *tables: Table) -> bool:
        """Make each table exactly as rendered: the ones that differ are replaced in one
        transaction (one write), the others are not touched. True when it wrote."""
        changed = [t for t in tables if self.digest(t.family, t.name) != t.digest]
        if not changed:
            return False
        script = "".join(
            f"table {t.family} {t.name}\ndelete table {t.family} {t.name}\n{t.render()}"
            for t in changed
        )
        self._transact(script, ", ".join(f"{t.family} {t.name}" for t in changed))
        return True

    def delete(self, family: str, name: str) -> bool:
        """Remove a table; a missing one costs no write, and without libnftables every
        table is missing (Kumo cannot have written one). True when it wrote."""
        if self._ctx is None:
            return False
        rc, out, err = self._run(f"list tables {family}")
        if rc:
            raise NetworkDriverError(f"list tables {family}: {err.strip()}")
        if f"table {family} {name}\n" not in out:
            return False
        self._transact(f"delete table {family} {name}\n", f"delete {family} {name}")
        return True

    def _transact(self, script: str, what: str) -> None:
        self.writes += 1
        rc, _, err = self._run(script)
        if rc:
            raise NetworkDriverError(f"nft {what}: {err.strip()}")
