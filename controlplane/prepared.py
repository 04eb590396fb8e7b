"""Statements PostgreSQL parses and plans once per connection, not once per run.

Kumo sends the same statements over and over with other values: the ORM's few hundred
shapes, the token lookup (``controlplane.rowjoin``), a list's page or a detail compiled once
per view (``controlplane.api.fastread``), the controller's short way for a fleet's steady
reports (``compute.services.steady``), hundreds a second. Sent with the values written into
the text, each is parsed and planned again every time; for small statements planning costs
PostgreSQL more than running them. So Kumo's settings (``KUMO_DATABASE_PREPARED``, on by
default) have psycopg bind values as parameters and keep each statement a connection runs a
fifth time prepared on it (psycopg's statement cache, per connection), through Django's
backend with one change (``controlplane.postgresql``: a statement of more values than
PostgreSQL binds is sent with them in its text).

- ``cursor(connection)`` is Django's cursor (its health check, error wrapping and query
  log, as ``connection.cursor()``) over a psycopg cursor that prepares what it runs again:
  the connection's own where the settings bind server-side, else one that binds
  server-side and prepares a statement at its second run (the hottest reads are prepared
  even with the setting off). On any other database it is ``connection.cursor()``.
- ``fetch`` runs one read through it, and lets that read stand for the connection's health
  check.
- ``client_cursor(connection)`` is Django's cursor over a psycopg cursor that writes the
  values into the text, and that psycopg's statement cache does not watch: what a claim
  needs to send its savepoint, its own preparation and its statement as one string in one
  round trip (``compute.claims.execute_prepared``), which server-side binding cannot send,
  without psycopg deallocating what the claim prepared.
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
    if connection.vendor != "postgresql" or connection.features.uses_server_side_binding:
        with connection.cursor() as plain:
            yield plain
        return
    with _cursor_of(connection, _preparing_cursor_class(), prepare=True) as prepared:
        yield prepared


@contextmanager
def client_cursor(connection):
    if connection.vendor != "postgresql":
        with connection.cursor() as plain:
            yield plain
        return
    with _cursor_of(connection, _unwatched_client_cursor_class()) as client:
        yield client


def _cursor_of(connection, cursor_class, *, prepare: bool = False) -> CursorWrapper:
    # As BaseDatabaseWrapper._cursor and the PostgreSQL backend's create_cursor do, with a
    # psycopg cursor of ``cursor_class``.
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID, register_tzloader
    from psycopg.pq import Format

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        if prepare and connection.connection.prepare_threshold is None:
            # Prepared statements off in the settings (None): a statement this module's
            # cursor runs a second time on the connection is prepared, one run once (a
            # deep page of a list) is not, and costs no round trip to prepare it.
            connection.connection.prepare_threshold = 1
        raw = cursor_class(connection.connection)
        loader = connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
        if connection.timezone != loader.timezone:
            register_tzloader(connection.timezone, raw)
        return connection._prepare_cursor(raw)


@cache
def _unwatched_client_cursor_class():
    from django.db.backends.postgresql.base import Cursor  # Django's client-side binding

    class UnwatchedClientCursor(Cursor):
        """What it runs is neither counted nor watched by psycopg's statement cache, which
        deallocates every statement of the connection when a text new to it answers
        ``ROLLBACK``: a claim's preparation ends with ``ROLLBACK TO SAVEPOINT`` (it undoes
        only settings), which would take the statement it just prepared with it, and so
        would a lost race's undo (it undoes only the claim's own row writes). Nothing rolled
        back there creates or drops what a prepared statement reads, which is what
        psycopg's clearing guards against."""

        def execute(self, query, params=None, **kwargs):
            threshold = self.connection.prepare_threshold
            self.connection.prepare_threshold = None
            try:
                return super().execute(query, params, **kwargs)
            finally:
                self.connection.prepare_threshold = threshold

    return UnwatchedClientCursor


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
