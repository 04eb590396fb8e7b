"""A second PostgreSQL connection to the test database, outside Django's: what another
process would see (row locks held, a session to terminate)."""

import psycopg
from django.db import connection


def second_connection() -> psycopg.Connection:
    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname=settings["NAME"],
        autocommit=True,
    )
