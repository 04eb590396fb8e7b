"""Statements PostgreSQL parses and plans once per connection, not once per request.

The SQL every API request runs is the same text each time with other values: the token
lookup (``controlplane.rowjoin``) and a list's page or a detail compiled once per view
(``controlplane.api.fastread``); so are the statements of the controller's short way for a
fleet's steady reports (the heartbeat's and the network report's one UPDATE, a guests
report's two: ``compute.services.steady``), hundreds a second. Django's cursors send each
statement with its values written into the text, which PostgreSQL parses and plans again
every time; for these small statements planning costs it more than running them.
``cursor(connection)`` is Django's cursor (its health check, error wrapping and query log,
as ``connection.cursor()``) over a psycopg cursor that binds the values as parameters and
asks PostgreSQL to keep each statement it runs again prepared on the connection (psycopg's
statement cache, per connection: a new connection prepares them again). On any other
database it is ``connection.cursor()``. ``fetch`` runs one read through it, and lets that
read stand for the connection's health check.
"""

from contextlib import contextmanager
from functools import cache

from django.db import InterfaceError, OperationalError
from django.db.backends.utils import CursorWrapper


def fetch(connection, sql: str, params) -> list[tuple]:
    """The rows of one read statement, run through ``cursor``.

    On a connection kept from an earlier request whose health check (``CONN_HEALTH_CHECKS``)
    is still to be done, the statement is the check: Django would first send ``SELECT 1``,
    one more round trip on every request. If the statement fails and the connection turns
    out unusable (it was lost while idle), the connection is replaced and the statement run
    again, as Django's check would have replaced it before; any other failure is raised as it
    is. Only outside a transaction, where running a read again changes nothing."""
    probe = (
        connection.vendor == "postgresql"
        and connection.connection is not None
        and connection.health_check_enabled
        and not connection.health_check_done
        and not connection.in_atomic_block
    )
    if probe:
        connection.health_check_done = True
    try:
        with cursor(connection) as executing:
            executing.execute(sql, params)
            return executing.fetchall()
    except (OperationalError, InterfaceError):
        if not probe or connection.is_usable():
            raise
    connection.close()  # lost while idle: a new connection, as the health check would open
    with cursor(connection) as executing:
        executing.execute(sql, params)
        return executing.fetchall()


@contextmanager
def cursor(connection):
    if connection.vendor != "postgresql":
        with connection.cursor() as plain:
            yield plain
        return
    with _prepared_cursor(connection) as prepared:
        yield prepared


def _prepared_cursor(connection) -> CursorWrapper:
    # As BaseDatabaseWrapper._cursor and the PostgreSQL backend's create_cursor do, with a
    # server-side binding cursor that prepares what it runs.
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID, register_tzloader
    from psycopg.pq import Format

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        if connection.connection.prepare_threshold is None:
            # Django's connections prepare nothing (None). psycopg prepares only for
            # server-side binding cursors, which Kumo's settings leave to this module: a
            # statement run a second time on the connection is prepared, one run once (a
            # deep page of a list) is not, and costs no round trip to prepare it.
            connection.connection.prepare_threshold = 1
        raw = _preparing_cursor_class()(connection.connection)
        loader = connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
        if connection.timezone != loader.timezone:
            register_tzloader(connection.timezone, raw)
        return connection._prepare_cursor(raw)


@cache
def _preparing_cursor_class():
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparingCursor(ServerBindingCursor):
        def execute(self, query, params=None, *, prepare=None, binary=None):
            try:
                return super().execute(query, params, prepare=prepare, binary=binary)
            finally:
                self._query = _Executed(self.connection, query, params)

    return PreparingCursor


class _Executed:
    """The statement a cursor last ran, where Django's query log reads it
    (``cursor._query.query``, which psycopg leaves unset for a prepared statement): its SQL
    with the values written in, as Django logs its own statements, composed only when read."""

    __slots__ = ("connection", "params", "sql")

    def __init__(self, connection, sql, params) -> None:
        self.connection, self.sql, self.params = connection, sql, params

    @property
    def query(self) -> bytes:
        from psycopg import ClientCursor

        return ClientCursor(self.connection).mogrify(self.sql, self.params).encode()
