"""A guest's interactive serial console, opened through libvirt and handed out as a socket.

Django-free: the console proxy (``compute.consoleproxy``) resolves who may connect and
to which host; this module only talks to that host's libvirt. ``virDomainOpenConsole``
gives the bytes of the guest's first serial port (the ``<serial type='pty'>`` of
``domain_xml``, whose ``<log>`` keeps logging meanwhile) as a libvirt stream over the
host's libvirt connection, local (``qemu:///system``) or remote (``qemu+tls://host/system``),
so the guest's definition needs nothing more and no port is opened on the host.

The stream is bridged to one end of a socket pair by two threads, so whatever relays it
(websockify's select loop) sees an ordinary socket: bytes the guest writes come out of
it, bytes written to it go to the guest. Closing that socket ends the session: both
threads stop, the stream is aborted and the libvirt connection closed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

import libvirt

from compute.drivers import domain_xml
from compute.drivers.base import DriverError, GuestNotFound

log = logging.getLogger(__name__)

CHUNK = 4096


class ConsoleUnavailable(DriverError):
    """The guest's console cannot be opened: not running, or the host refuses."""


def open_console(uri: str, vm_id: str) -> socket.socket:
    """The guest ``vm_id``'s serial console on the libvirt at ``uri``, as a connected
    socket; the caller owns it and closes it to end the session.

    A session already open on that console (another browser tab, a ``virsh console``) is
    taken over (``VIR_DOMAIN_CONSOLE_FORCE``): the newest viewer wins, so a session left
    behind by a closed laptop never locks the console. Raises ``GuestNotFound`` when the
    host has no such guest and ``ConsoleUnavailable`` when it is not running or libvirt
    refuses."""
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise ConsoleUnavailable(f"cannot reach libvirt at {uri}: {exc}") from exc
    stream = None
    try:
        try:
            dom = conn.lookupByName(domain_xml.domain_name(vm_id))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                raise GuestNotFound(f"no guest {vm_id} on {uri}") from exc
            raise ConsoleUnavailable(f"cannot look up guest {vm_id}: {exc}") from exc
        if not dom.isActive():
            raise ConsoleUnavailable(f"guest {vm_id} is not running")
        stream = conn.newStream(0)
        try:
            dom.openConsole(None, stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
        except libvirt.libvirtError as exc:
            raise ConsoleUnavailable(f"cannot open the console of {vm_id}: {exc}") from exc
    except BaseException:
        if stream is not None:
            _quietly(stream.abort)
        _quietly(conn.close)
        raise
    ours, theirs = socket.socketpair()
    _Bridge(conn, stream, ours, vm_id).start()
    return theirs


class _Bridge:
    """Two threads between a libvirt stream and a socket; the first to see an end (the
    guest's side closed, or the socket) closes both."""

    def __init__(self, conn, stream, sock: socket.socket, vm_id: str):
        self.conn, self.stream, self.sock, self.vm_id = conn, stream, sock, vm_id
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        for target, name in ((self._from_guest, "out"), (self._to_guest, "in")):
            threading.Thread(
                target=target, name=f"console-{self.vm_id[:8]}-{name}", daemon=True
            ).start()

    def _from_guest(self) -> None:
        try:
            while True:
                data = self.stream.recv(CHUNK)
                if not data or not isinstance(data, bytes):  # b"": end; -2: cannot happen
                    break
                self.sock.sendall(data)
        except (libvirt.libvirtError, OSError) as exc:
            log.debug("console %s: guest side ended: %s", self.vm_id, exc)
        finally:
            self.close()

    def _to_guest(self) -> None:
        try:
            while True:
                data = self.sock.recv(CHUNK)
                if not data:
                    break
                while data:
                    sent = self.stream.send(data)
                    if sent < 0:  # -2, "would block": cannot happen on a blocking stream
                        raise OSError(f"libvirt stream send answered {sent}")
                    data = data[sent:]
        except (libvirt.libvirtError, OSError) as exc:
            log.debug("console %s: client side ended: %s", self.vm_id, exc)
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _quietly(lambda: self.sock.shutdown(socket.SHUT_RDWR))
        _quietly(self.sock.close)
        _quietly(self.stream.abort)
        _quietly(self.conn.close)


def _quietly(fn) -> None:
    with contextlib.suppress(libvirt.libvirtError, OSError):
        fn()
