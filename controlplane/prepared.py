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
PostgreSQL binds is sent with them in its text). With the setting off, nothing is prepared
but the claims' own statements (``compute.claims``), which notice a connection that lost
them and prepare them again.

- ``fetch`` runs one read on Django's cursor, and lets that read stand for the connection's
  health check.
- ``cursor(connection)`` is a cursor to run one statement on: Django's, or, where nothing
  watches what the connection runs, the one kept on the connection (``KeptCursor``).
- ``client_cursor(connection)`` is Django's cursor over a psycopg cursor that writes the
  values into the text, and that psycopg's statement cache does not watch: what a claim
  needs to send its savepoint, its own preparation and its statement as one string in one
  round trip (``compute.claims.execute_prepared``), which server-side binding cannot send,
  without psycopg deallocating what the claim prepared.
"""

from contextlib import contextmanager
from functools import cache

from django.db import InterfaceError, OperationalError


def fetch(connection, sql: str, params) -> list[tuple]:
    """The rows of one read statement.

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
    with connection.cursor() as executing:
        executing.execute(sql, params)
        return executing.fetchall()


def cursor(connection):
    """A cursor to run one statement on, as ``with cursor(connection) as c`` (``execute``,
    ``fetchall``, ``rowcount``). Django makes a new cursor, and its wrapper, for every
    statement, about 40 µs here, a third of a small read's round trip; the statements Kumo
    runs most (``controlplane.compiled``'s) run instead on one psycopg cursor kept on the
    connection, as Django's wrapper runs them: the same check of a broken transaction, the
    same errors. Django's own cursor, whenever something watches what the connection runs
    (its queries logged, as tests count them; an execute wrapper) or it is not yet open or
    still to be checked (``CONN_HEALTH_CHECKS``): that cursor opens and checks it."""
    raw = connection.connection
    if (
        raw is None
        or connection.queries_logged
        or connection.execute_wrappers
        or (connection.health_check_enabled and not connection.health_check_done)
    ):
        return connection.cursor()
    kept = getattr(connection, "kumo_kept_cursor", None)
    if kept is None or kept.raw is not raw:  # a new connection: a new cursor
        with connection.wrap_database_errors:
            kept = KeptCursor(connection, raw, connection.create_cursor())
        connection.kumo_kept_cursor = kept
    connection.validate_thread_sharing()
    return kept


class KeptCursor:
    """The cursor ``cursor`` keeps on a connection (``raw``, the driver's connection it was
    made on), used as Django's ``CursorWrapper`` is; leaving the block keeps it open."""

    __slots__ = ("cursor", "db", "raw")

    def __init__(self, db, raw, cursor) -> None:
        self.db, self.raw, self.cursor = db, raw, cursor

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def execute(self, sql, params=None):
        self.db.validate_no_broken_transaction()
        with self.db.wrap_database_errors:
            if params is None:
                return self.cursor.execute(sql)
            return self.cursor.execute(sql, params)

    def fetchall(self) -> list:
        with self.db.wrap_database_errors:
            return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


@contextmanager
def client_cursor(connection):
    if connection.vendor != "postgresql":
        with connection.cursor() as plain:
            yield plain
        return
    # As BaseDatabaseWrapper._cursor and the PostgreSQL backend's create_cursor make a
    # cursor, of the class below.
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID, register_tzloader
    from psycopg.pq import Format

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = _unwatched_client_cursor_class()(connection.connection)
        loader = connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
        if connection.timezone != loader.timezone:
            register_tzloader(connection.timezone, raw)
    with connection._prepare_cursor(raw) as client:
        yield client


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
