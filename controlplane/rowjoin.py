"""One row and its foreign key's row, read with SQL built once per process.

Every API request looks up its token (with the token's user) and then the caller's
membership (with its project). Through the ORM each such lookup compiles its SQL anew,
which costs more CPU than the database spends answering it. ``JoinedLookup`` builds the
same ``SELECT … JOIN …`` once from the models' metadata and, per call, only executes it and
turns the row into model instances the way the ORM does (the database backend's and each
field's converters, ``Model.from_db``, the relation cached as ``select_related`` would).
"""

from __future__ import annotations

from django.db import connections, router


class JoinedLookup:
    """``lookup.first(*params)``: the ``model`` row matching ``where`` with its ``relation``
    loaded, or None. ``where`` is SQL over the aliases ``m`` (the model) and ``r`` (the
    related model), with ``%s`` placeholders; it must match at most one row (a unique key),
    as the lookups it serves do."""

    def __init__(self, model, relation: str, where: str) -> None:
        self.model = model
        self.field = model._meta.get_field(relation)
        self.related = self.field.related_model
        self.where = where
        self._fields = [f for f in model._meta.concrete_fields]
        self._related_fields = [f for f in self.related._meta.concrete_fields]
        columns = [f'm."{f.column}"' for f in self._fields]
        columns += [f'r."{f.column}"' for f in self._related_fields]
        self.sql = (
            f'SELECT {", ".join(columns)} FROM "{model._meta.db_table}" m '
            f'JOIN "{self.related._meta.db_table}" r ON r."{self.field.target_field.column}" '
            f'= m."{self.field.column}" WHERE {where} LIMIT 1'
        )
        self._converters: dict[str, tuple] = {}

    def _converters_for(self, alias: str, connection) -> tuple:
        """Per column, the converters the ORM's compiler would apply to it."""
        cached = self._converters.get(alias)
        if cached is None:
            cached = tuple(
                tuple(_column_converters(field, table, connection))
                for table, fields in (
                    (self.model._meta.db_table, self._fields),
                    (self.related._meta.db_table, self._related_fields),
                )
                for field in fields
            )
            self._converters[alias] = cached
        return cached

    def first(self, *params):
        alias = router.db_for_read(self.model)
        connection = connections[alias]
        with connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        values = []
        for value, converters in zip(row, self._converters_for(alias, connection), strict=True):
            for convert, expression in converters:
                value = convert(value, expression, connection)
            values.append(value)
        split = len(self._fields)
        obj = self.model.from_db(alias, [f.attname for f in self._fields], values[:split])
        related = self.related.from_db(
            alias, [f.attname for f in self._related_fields], values[split:]
        )
        self.field.set_cached_value(obj, related)
        return obj


def _column_converters(field, table: str, connection):
    expression = field.get_col(table)
    backend = connection.ops.get_db_converters(expression)
    own = expression.get_db_converters(connection)
    return [(convert, expression) for convert in (*backend, *own)]
