"""Django's PostgreSQL backend, for a connection that binds values server-side.

PostgreSQL's protocol counts a statement's parameters in 16 bits, so a statement sent with
its values apart takes at most 65,535 of them; written into the text, as Django's default
client-side binding does, it takes any number. Django's backend knows no such limit: a
``bulk_create`` of thousands of rows is one ``INSERT``, and a long ``__in`` list is one
statement. With server-side binding on (Kumo's settings, ``controlplane.prepared``), such a
statement has its values written into its text, as before, and is not prepared; every
other statement is bound and prepared as the settings say.

``ENGINE = "controlplane.postgresql"``; Kumo's settings name it when they bind server-side.
"""

from django.db.backends.postgresql import base
from psycopg import ClientCursor

#: the most parameters PostgreSQL takes with one statement (a 16-bit count)
MAX_PARAMS = 65_535


class ServerBindingCursor(base.ServerBindingCursor):
    def execute(self, query, params=None, **kwargs):
        if params is not None and len(params) > MAX_PARAMS:
            query, params = ClientCursor(self.connection).mogrify(query, params), None
        return super().execute(query, params, **kwargs)


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        params = super().get_connection_params()
        if params.get("cursor_factory") is base.ServerBindingCursor:
            params["cursor_factory"] = ServerBindingCursor
        return params
