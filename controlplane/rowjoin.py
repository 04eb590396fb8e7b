"""Rows and their related rows, read with SQL built once per process.

Every API request looks up its token (with the token's user) and, under a project's URL, the
caller's membership there (with its project). Through the ORM each such lookup compiles its
SQL anew, which costs more CPU than the database spends answering it. ``RowLookup`` builds
the ``SELECT … JOIN …`` once from the models' metadata and, per call, only executes it and
turns the row into model instances the way the ORM does (the database backend's and each
field's converters, ``Model.from_db``, relations cached as ``select_related`` would).
``JoinedLookup`` is its common case: one model and one foreign key. A host's report of a VM
(``compute.services.reconcile.vm_observed``) locks its host and its VM the same way, with a
locking clause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connections, router

from controlplane import prepared


@dataclass(frozen=True)
class Join:
    """One more table of a ``RowLookup``: ``model`` as ``alias``, joined ``ON`` SQL ``on``
    (over the aliases before it); ``outer`` makes it a LEFT JOIN, whose model is None in the
    answer when no row matched."""

    alias: str
    model: type
    on: str
    outer: bool = False


class RowLookup:
    """``lookup.first(*params)``: for the first row of ``model`` (as alias ``m``) and its
    ``joins`` matching ``where``, a dict of alias to model instance (None for an outer join
    that matched nothing), or None when no row matched. ``where`` and the joins' conditions
    are SQL with ``%s`` placeholders, whose params come in the order the SQL names them; the
    lookup must match at most one row (a unique key), as the lookups it serves do.

    ``relations`` are ``(alias, foreign key name, alias of the related row)``: each is
    cached on the instance, as ``select_related`` would, when both rows were found.

    ``lock``: a locking clause (``FOR UPDATE OF m``), added where the database locks rows,
    as ``select_for_update`` adds it; a locking lookup runs in the caller's transaction.
    """

    def __init__(
        self,
        model,
        *,
        joins: Sequence[Join] = (),
        where: str,
        relations: Sequence[tuple[str, str, str]] = (),
        lock: str = "",
    ) -> None:
        self.model = model
        self.tables = [("m", model), *((j.alias, j.model) for j in joins)]
        self._fields = {alias: list(model_._meta.concrete_fields) for alias, model_ in self.tables}
        self._pk_index = {
            alias: self._fields[alias].index(model_._meta.pk) for alias, model_ in self.tables
        }
        models_ = dict(self.tables)
        self.relations = [
            (alias, models_[alias]._meta.get_field(name), related)
            for alias, name, related in relations
        ]
        columns = [
            f'{alias}."{field.column}"' for alias, _ in self.tables for field in self._fields[alias]
        ]
        sql = f'SELECT {", ".join(columns)} FROM "{model._meta.db_table}" m'
        for join in joins:
            kind = "LEFT JOIN" if join.outer else "JOIN"
            sql += f' {kind} "{join.model._meta.db_table}" {join.alias} ON {join.on}'
        self.sql = f"{sql} WHERE {where} LIMIT 1"
        self.lock = lock
        self.locked_sql = f"{self.sql} {lock}" if lock else self.sql
        self._converters: dict[str, tuple] = {}

    def _converters_for(self, alias: str, connection) -> tuple:
        """Per column, the converters the ORM's compiler would apply to it."""
        cached = self._converters.get(alias)
        if cached is None:
            cached = tuple(
                tuple(column_converters(field, model._meta.db_table, connection))
                for table_alias, model in self.tables
                for field in self._fields[table_alias]
            )
            self._converters[alias] = cached
        return cached

    def first(self, *params) -> dict | None:
        alias = router.db_for_write(self.model) if self.lock else router.db_for_read(self.model)
        connection = connections[alias]
        sql = self.locked_sql if connection.features.has_select_for_update else self.sql
        rows = prepared.fetch(connection, sql, params)
        if not rows:
            return None
        row = rows[0]
        found, start = {}, 0
        converters = self._converters_for(alias, connection)
        for table_alias, model in self.tables:
            fields = self._fields[table_alias]
            end = start + len(fields)
            if row[start + self._pk_index[table_alias]] is None:
                found[table_alias] = None  # an outer join that matched nothing
            else:
                values = []
                for value, steps in zip(row[start:end], converters[start:end], strict=True):
                    for convert, expression in steps:
                        value = convert(value, expression, connection)
                    values.append(value)
                found[table_alias] = model.from_db(alias, [f.attname for f in fields], values)
            start = end
        for table_alias, field, related in self.relations:
            if found[table_alias] is not None and found[related] is not None:
                field.set_cached_value(found[table_alias], found[related])
        return found


class JoinedLookup:
    """``lookup.first(*params)``: the ``model`` row matching ``where`` with its ``relation``
    loaded, or None. ``where`` is SQL over the aliases ``m`` (the model) and ``r`` (the
    related model), with ``%s`` placeholders; it must match at most one row (a unique key),
    as the lookups it serves do."""

    def __init__(self, model, relation: str, where: str, *, lock: str = "") -> None:
        field = model._meta.get_field(relation)
        self._lookup = RowLookup(
            model,
            joins=[
                Join(
                    "r",
                    field.related_model,
                    f'r."{field.target_field.column}" = m."{field.column}"',
                )
            ],
            where=where,
            relations=[("m", relation, "r")],
            lock=lock,
        )
        self.sql = self._lookup.sql

    def first(self, *params):
        found = self._lookup.first(*params)
        return None if found is None else found["m"]


def pk_param(model, value, connection):
    """``value``, a primary key of ``model`` as a caller names it (a str for a UUID), as
    ``connection`` takes it in a lookup's params, converted as the ORM converts a lookup's
    value: one that is no valid key raises as the ORM raises."""
    key = model._meta.pk
    return key.get_db_prep_value(key.to_python(value), connection)


def column_converters(field, table: str, connection):
    """The converters the ORM's compiler applies to ``field``'s column of ``table``, each
    with its expression, in order."""
    expression = field.get_col(table)
    backend = connection.ops.get_db_converters(expression)
    own = expression.get_db_converters(connection)
    return [(convert, expression) for convert in (*backend, *own)]
