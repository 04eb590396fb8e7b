"""How the suite uses its test database cheaply, without changing what a test sees.

- ``flush_by_delete``: between transactional tests Django empties every table with one
  ``TRUNCATE``, which PostgreSQL makes a new file for, table by table: about 0.9 s for Kumo's
  70 tables on a 2-core machine, paid after each of the suite's ~180 transactional tests.
  ``DELETE FROM`` each table empties the few rows a test left in 0.08 s. Django's foreign
  keys on PostgreSQL are ``DEFERRABLE INITIALLY DEFERRED`` and the flush runs in one
  transaction, so the order of the tables does not matter.
- ``module_rows``: rows that every test of a module reads and none keeps, made once for the
  module instead of once per test (Django's ``TestCase.setUpTestData``): they are written in
  a transaction around the module's tests, each test runs in a savepoint inside it (as
  pytest-django runs any ``django_db`` test), and the transaction is rolled back after the
  module's last test. Only for modules without transactional tests: pytest-django runs
  those after every other test, and one that ran next to its module's last other test would
  run inside the module's open transaction. ``module_rows`` refuses such a module.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db import transaction
from django.db.backends.postgresql.operations import DatabaseOperations


def flush_by_delete() -> None:
    """From now on, Django's flush on PostgreSQL deletes rows instead of truncating tables
    (unless it is asked to reset sequences or cascade, which only ``TRUNCATE`` does)."""
    truncate = DatabaseOperations.sql_flush
    if getattr(truncate, "by_delete", False):
        return

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        return (
            ["; ".join(f"DELETE FROM {self.quote_name(table)}" for table in tables)]
            if tables
            else []
        )

    sql_flush.by_delete = True
    DatabaseOperations.sql_flush = sql_flush


@contextmanager
def module_rows(request, django_db_blocker, make):
    """Open the module's transaction and call ``make()`` in it: what it returns, and the
    rows it wrote, stay for each of the module's tests, and are rolled back at its end.
    ``request``: the module fixture's, whose module must have no transactional test."""
    transactional = [
        item.name
        for item in request.session.items
        if getattr(item, "module", None) is request.module and _transactional(item)
    ]
    if transactional:
        raise pytest.UsageError(
            f"{request.module.__name__} makes rows once for the module (module_rows) and has "
            f"transactional tests, which would run inside its transaction: {transactional}"
        )
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
    try:
        with django_db_blocker.unblock():
            made = make()
        yield made
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


def _transactional(item) -> bool:
    """Whether pytest-django runs ``item`` as a transactional test, as it decides when it
    orders the tests (its own reading of the ``django_db`` marker)."""
    from django.test import TestCase, TransactionTestCase
    from pytest_django.fixtures import validate_django_db

    cls = getattr(item, "cls", None)
    if cls is not None and issubclass(cls, TransactionTestCase):
        return not issubclass(cls, TestCase)
    marker = item.get_closest_marker("django_db")
    if marker is not None:
        transaction, reset_sequences, *_ = validate_django_db(marker)
        if transaction or reset_sequences:
            return True
    fixtures = getattr(item, "fixturenames", ())
    return "transactional_db" in fixtures or "live_server" in fixtures
