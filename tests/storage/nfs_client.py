"""Just enough of an NFS client to ask an NFS server whether it lets an address mount an
export: the MOUNT protocol's MNT call (RFC 1813, program 100005 version 3), over ONC RPC
on TCP (RFC 5531) with AUTH_SYS credentials, exactly what a Linux client sends before an
NFSv3 mount. The server answers with its own export access check: ``MNT3_OK`` (0) and a
file handle, or ``MNT3ERR_ACCES`` (13). No kernel NFS client is needed."""

import random
import socket
import struct

MOUNT_PROGRAM, MOUNT_V3, MOUNTPROC3_MNT = 100005, 3, 1
MNT3_OK, MNT3ERR_NOENT, MNT3ERR_ACCES = 0, 2, 13


def _string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value + b"\0" * (-len(value) % 4)


def mnt(server: str, port: int, path: str, *, source: str = "", timeout: float = 5) -> int:
    """Send MNT ``path`` to ``server``:``port`` (from address ``source`` when given); the
    server's mountstat3."""
    xid = random.getrandbits(32)
    credential = struct.pack(">I", 0) + _string(b"kumo-test") + struct.pack(">III", 0, 0, 0)
    call = (
        struct.pack(">IIIIII", xid, 0, 2, MOUNT_PROGRAM, MOUNT_V3, MOUNTPROC3_MNT)
        + struct.pack(">I", 1)  # AUTH_SYS
        + _string(credential)
        + struct.pack(">II", 0, 0)  # verifier: AUTH_NONE
        + _string(path.encode())
    )
    with socket.create_connection(
        (server, port), timeout=timeout, source_address=(source, 0) if source else None
    ) as s:
        s.sendall(struct.pack(">I", 0x80000000 | len(call)) + call)
        reply = b""
        while True:
            (mark,) = struct.unpack(">I", _read(s, 4))
            reply += _read(s, mark & 0x7FFFFFFF)
            if mark & 0x80000000:
                break
    got_xid, kind, reply_stat = struct.unpack(">III", reply[:12])
    if got_xid != xid or kind != 1 or reply_stat != 0:
        raise ConnectionError(f"MNT {path}: RPC denied ({reply[:24].hex()})")
    _flavor, length = struct.unpack(">II", reply[12:20])
    offset = 20 + length + (-length % 4)
    (accept_stat,) = struct.unpack(">I", reply[offset : offset + 4])
    if accept_stat != 0:
        raise ConnectionError(f"MNT {path}: accept_stat {accept_stat}")
    (status,) = struct.unpack(">I", reply[offset + 4 : offset + 8])
    return status


def _read(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


if __name__ == "__main__":  # python -m tests.storage.nfs_client SERVER PORT PATH
    import sys

    print(mnt(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
