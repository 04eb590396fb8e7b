"""Statements the ORM builds once and Kumo runs again with other values.

Django builds and compiles a queryset's SQL at every call: for the small reads that run on
every request, report or release, that costs more than the database takes to answer them.
``compile_read(build, count)`` calls ``build`` (a function of ``count`` values that returns a
queryset: model objects, ``values()`` or ``values_list()``) twice with different stand-ins
and keeps the SQL when the two compilations differ only where the stand-ins are: each later
run binds its own values there and runs that SQL, its rows converted and its objects built
as the ORM does. The statement stays the ORM's own, so it cannot drift from the queryset it
was compiled from. Values are integers unless ``kinds`` says otherwise (``UUID``, ``str``):
a VM's key, a usage interval's subject.

``Compiled(build, *kinds)`` is such a read declared once beside the code that runs it,
compiled on its first run for each kind of database. ``CompiledUpdate(build, *kinds)`` is
the same for an UPDATE: ``build`` answers the queryset and the changes that
``queryset.update(**changes)`` would write, and each run binds its values (a time, a
number, a key) where the stand-ins were. ``update_where(model, where, changes)`` is one of
those for each shape of a row's update whose fields vary with the call (a VM's transition).
``insert(obj)`` writes a new instance as ``save`` would, its ``INSERT`` built once per model.

A read runs as a statement PostgreSQL keeps prepared on the connection
(``controlplane.prepared``).

Used by the API's list and detail answers (``controlplane.api.fastread``), the scheduler's
read of one host and its lock of a pending VM (``compute.placement``), and the reads every
message to a host agent and every usage interval make (``compute``, ``network``,
``storage``, ``tenants``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any
from uuid import UUID

from django.core.exceptions import EmptyResultSet
from django.db import connection as default_connection
from django.db import connections, models, router, transaction
from django.db.models.fields.json import KeyTransform
from django.db.models.query import (
    ModelIterable,
    ValuesIterable,
    ValuesListIterable,
    get_related_populators,
)
from django.db.models.sql import UpdateQuery

from controlplane import prepared
from controlplane.rowjoin import column_converters


def stand_in(kind: type, which: int, position: int):
    """The stand-in of value ``position`` of kind ``kind`` in compilation ``which`` (0 or 1):
    the places where the two compilations' parameters differ, each by its own stand-in, are
    the values'. An integer is negative, as no key of Kumo's is, so no constant of the query
    can be taken for one (and within a 32-bit integer's range, which Django checks a key
    against); a UUID, a text, a number with a fraction, a time and a JSON object are ones no
    row holds (a time in 1901)."""
    if kind is int:
        return -2_013_560_101 - 10 * which - position
    if kind is Positive:
        return 32_749 - 10 * which - position  # within a small positive column's range too
    if kind is float:
        return -2_013_560_101.25 - 10 * which - position
    if kind is datetime:
        return datetime(1901, 1, 1, tzinfo=UTC) + timedelta(seconds=10 * which + position)
    if kind is dict:
        return {"\x1fkumo stand-in": [which, position]}
    if kind is UUID:
        return UUID(int=(0x6B756D6F << 96) | (which << 32) | position)
    if kind is str:
        return f"\x1fkumo stand-in {which}.{position}"
    raise TypeError(f"no stand-in for {kind.__name__} values")


#: The integer stand-ins of both compilations (``stand_in``), for up to two values.
STAND_INS = tuple(tuple(stand_in(int, which, n) for n in range(2)) for which in (0, 1))


class Positive(int):
    """The kind of a value a positive integer column holds (a generation, a VM's GPUs): its
    stand-ins are positive and within a small column's range, as Django finds one outside
    the column's range and compiles no statement for it."""


_UUIDS = models.UUIDField()


def _as_uuid(value) -> UUID:
    """``value`` as a UUID, refused as the ORM refuses a value that is none."""
    return value if type(value) is UUID else _UUIDS.to_python(value)


def _binding(
    kind: type, param, first, second, other, connection=None
) -> Callable[[Any], Any] | None:
    """How a value of ``kind`` is bound where the compilations put ``param`` and ``other``
    for its stand-ins ``first`` and ``second``: ``None`` when that place is not the value's.
    A key of a model's ``UUIDField`` is bound as the field binds it on the database: the
    UUID itself where the database has the type (PostgreSQL), its hex digits elsewhere; so
    is a time as a ``DateTimeField`` binds it (the database's adaptation of it), and a whole
    number as its column's type wraps it."""
    if kind is UUID:
        if type(param) is UUID and param == first and other == second:
            return _as_uuid
        if param == first.hex and other == second.hex:
            return lambda value: _as_uuid(value).hex
        return None
    if kind is Positive:
        kind = int
    if kind is int and type(param) is not int and isinstance(param, int):
        # An integer column's value as the database's adaptation wraps it (PostgreSQL's
        # backend binds a value set as a 4-byte integer, psycopg's ``Int4``): wrapped alike.
        return type(param) if param == first and other == second else None
    if kind is dict:
        # A JSON value as a ``JSONField`` without an encoder of its own binds it: psycopg's
        # wrapper of it on PostgreSQL, its JSON text elsewhere.
        if isinstance(param, str):
            texts = param == json.dumps(first) and other == json.dumps(second)
            return json.dumps if texts else None
        if getattr(param, "obj", None) != first or getattr(other, "obj", None) != second:
            return None
        wrap, dumps = type(param), param.dumps
        return lambda value: wrap(value, dumps)
    if kind is datetime and connection is not None and type(param) is not datetime:
        adapt = connection.ops.adapt_datetimefield_value
        if param == adapt(first) and other == adapt(second):
            return adapt
        return None
    if type(param) is kind and param == first and other == second:
        return _identity
    return None


def _identity(value):
    return value


class CompiledRead:
    """A query's SQL compiled once, and how to run it again with other values where its
    stand-ins were (``compile_read``): a ``values()`` or ``values_list()`` query's rows as
    ``values()`` answers them (``rows``) or as tuples in the same order (``tuples``), each
    column converted as the ORM's compiler converts it; a query of model objects' objects
    (``objects``), built as the ORM builds them, its ``select_related`` objects included. Only
    the SQL text and constants are kept between runs; every value a run is given is a bound
    parameter of that run."""

    __slots__ = (
        "alias",
        "building",
        "converters",
        "model",
        "names",
        "ordered",
        "params",
        "places",
        "sql",
    )

    def __init__(
        self, *, model, alias, sql, params, places, names, converters, ordered, building=None
    ) -> None:
        self.model, self.alias, self.sql, self.params = model, alias, sql, params
        self.places, self.names, self.converters, self.ordered = places, names, converters, ordered
        self.building = building

    def objects(self, values: tuple, suffix: str = "") -> list:
        """The model objects of a query of them, as the ORM builds them."""
        return self.built(self._fetch(values, suffix)[0])

    def built(self, fetched: list[tuple]) -> list:
        """The model objects of rows this read's SQL answered (a caller that ran it itself)."""
        start, end, init_list, populators = self.building
        connection = connections[self.alias]
        steps, from_db, alias = self._steps(connection), self.model.from_db, self.alias
        answer = []
        for row in _converted(fetched, steps):
            obj = from_db(alias, init_list, row[start:end])
            for populator in populators:
                populator.populate(row, obj)
            answer.append(obj)
        return answer

    def bound(self, values: tuple) -> list:
        """The statement's parameters with ``values`` in their places."""
        params = list(self.params)
        for index, which, bind in self.places:
            params[index] = bind(values[which])
        return params

    def rows(self, values: tuple, suffix: str = "") -> list[dict]:
        fetched, connection = self._fetch(values, suffix)
        names = self.names
        return [
            dict(zip(names, row, strict=True))
            for row in _converted(fetched, self._steps(connection))
        ]

    def tuples(self, values: tuple, suffix: str = "") -> list[tuple]:
        """The rows as tuples of the columns ``names`` says, in that order (what
        ``values_list()`` answers)."""
        fetched, connection = self._fetch(values, suffix)
        steps = self._steps(connection)
        return [tuple(row) for row in _converted(fetched, steps)] if steps else fetched

    def answers(self, plan, values: tuple, suffix: str = "") -> tuple[list, dict | None]:
        """The answers ``plan.render_many(self.rows(values, suffix))`` gives, made from the
        rows as they are fetched: each column converted as the ORM converts it, then each
        field as the plan (the API's ``fastread.ReadPlan``) converts it, with no row dict in
        between. Also the first row as
        ``rows`` gives it (None when there is none), for a column no field shows (a count)."""
        fetched, connection = self._fetch(values, suffix)
        steps = self._steps(connection)
        fields, pick, converts = plan.shape(self.names)
        answers, first = [], None
        for row in _converted(fetched, steps):
            if first is None:
                first = dict(zip(self.names, row, strict=True))
            picked = pick(row)
            if converts:
                picked = list(picked)
                for index, convert in converts:
                    if (value := picked[index]) is not None:
                        picked[index] = convert(value)
            answers.append(dict(zip(fields, picked, strict=True)))
        return answers, first

    def _fetch(self, values: tuple, suffix: str) -> tuple[list[tuple], Any]:
        connection = connections[self.alias]
        return prepared.fetch(connection, self.sql + suffix, self.bound(values)), connection

    def _steps(self, connection) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
        """(column, function of its value) for each column the ORM's compiler converts."""
        return tuple(
            (position, _column_converter(functions, expression, connection))
            for position, (functions, expression) in self.converters
        )


def _converted(fetched: list[tuple], steps) -> list:
    """The rows of ``fetched``, each with its columns converted by ``steps`` (``_steps``):
    as lists where there is something to convert, as they are otherwise."""
    if not steps:
        return fetched
    converted = []
    for row in fetched:
        row = list(row)
        for position, convert in steps:
            row[position] = convert(row[position])
        converted.append(row)
    return converted


#: the scanner of the decoder ``json.loads`` uses (no hooks, strict), without its wrappers
_scan_json = json.JSONDecoder().scan_once


def _column_converter(functions, expression, connection) -> Callable[[Any], Any]:
    """The ORM's converters of one column as one function of its value. A ``JSONField``
    without its own decoder is read by the scanner ``json.loads`` runs, when that scanner
    alone reads the whole text (no surrounding space, valid JSON): what Django's
    ``from_db_value`` answers, without its layers; any other text goes to Django's."""
    if len(functions) == 1:
        (convert,) = functions
        owner = getattr(convert, "__self__", None)
        if (
            getattr(convert, "__func__", None) is models.JSONField.from_db_value
            and owner.decoder is None
            and not isinstance(expression, KeyTransform)
        ):

            def json_value(value):
                if type(value) is str:
                    try:
                        decoded, end = _scan_json(value, 0)
                    except (StopIteration, ValueError):
                        pass
                    else:
                        if end == len(value):
                            return decoded
                return convert(value, expression, connection)

            return json_value
        return lambda value: convert(value, expression, connection)

    def chained(value):
        for convert in functions:
            value = convert(value, expression, connection)
        return value

    return chained


def _places(sql, params, other_sql, other_params, sets, kinds, connection) -> list | None:
    """Where the values go in a statement compiled twice (``sql`` and ``params`` with the
    stand-ins ``sets[0]``, the others with ``sets[1]``): ``(index, which, bind)`` for each
    parameter that is value ``which``'s, bound by ``bind``; None unless both compiled to
    the same text and every other parameter is the same constant in both (a text, a
    number, a truth value, one of a model's choices) that no stand-in could be."""
    if sql != other_sql or len(params) != len(other_params):
        return None
    places = []
    for index, (param, other) in enumerate(zip(params, other_params, strict=True)):
        found = [
            (which, bind)
            for which, kind in enumerate(kinds)
            if (bind := _binding(kind, param, sets[0][which], sets[1][which], other, connection))
        ]
        if found:
            places.append((index, *found[0]))
        elif param != other or not isinstance(param, str | int) or other in sets[1]:
            return None
    return places


def compile_read(
    build: Callable[..., models.QuerySet], count: int, kinds: tuple[type, ...] = ()
) -> CompiledRead | None:
    """The SQL of ``build(*values)``, a queryset of ``count`` values (of ``kinds``, integers
    by default), compiled once. ``build`` is called twice with different stand-ins, and the
    SQL is kept only when both compile to the same text whose parameters differ exactly
    where the stand-ins are, every stand-in has a place, and every other parameter is a
    constant (text, a number, a truth value, or one of a model's choices): a query whose SQL
    or constants depend on anything else (a time, a value the stand-ins don't reach) has
    none (None), and keeps the ORM's path. So has a query of objects that annotates them,
    prefetches or knows related objects (a related manager's): what the ORM adds to its
    objects beyond their rows."""
    kinds = tuple(kinds) or (int,) * count
    if len(kinds) != count:
        raise TypeError(f"{count} values, {len(kinds)} kinds")
    sets = [tuple(stand_in(kind, which, n) for n, kind in enumerate(kinds)) for which in (0, 1)]
    compiled = []
    for stand_ins in sets:
        queryset = build(*stand_ins)
        rows_as = None if queryset is None else queryset._iterable_class
        if rows_as not in (ValuesIterable, ValuesListIterable, ModelIterable):
            return None
        if rows_as is ModelIterable and (
            queryset._prefetch_related_lookups or queryset._known_related_objects
        ):
            return None
        compiler = queryset.query.get_compiler(using=queryset.db)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            return None
        compiled.append((queryset, compiler, sql, tuple(params)))
    (queryset, compiler, sql, params), (_, _, other_sql, other_params) = compiled
    places = _places(sql, params, other_sql, other_params, sets, kinds, compiler.connection)
    if places is None:
        return None
    # A choice's plain value: psycopg dumps a str faster than a str that is an Enum.
    params = tuple(value.value if isinstance(value, Enum) else value for value in params)
    fields = [column[0] for column in compiler.select[: compiler.col_count]]
    if {which for _, which, _ in places} != set(range(count)) or compiler.has_composite_fields(
        fields
    ):
        return None
    query, building = queryset.query, None
    if queryset._iterable_class is ModelIterable:
        info = compiler.klass_info
        if compiler.annotation_col_map or info is None:
            return None
        start, end = info["select_fields"][0], info["select_fields"][-1] + 1
        init_list = [column[0].target.attname for column in compiler.select[start:end]]
        populators = get_related_populators(info, compiler.select, queryset.db)
        names, building = (), (start, end, init_list, populators)
    elif query.selected:
        names = tuple(query.selected)
    else:
        names = (*query.extra_select, *query.values_select, *query.annotation_select)
    if building is None and len(names) != len(fields):
        return None
    return CompiledRead(
        model=queryset.model,
        alias=queryset.db,
        sql=sql,
        params=params,
        places=tuple(places),
        names=names,
        converters=tuple(compiler.get_converters(fields).items()),
        ordered=queryset.ordered,
        building=building,
    )


class Compiled:
    """A read declared once, where the module that runs it is loaded, and compiled on its
    first run for each kind of database (``compile_read``): ``build`` is a function of one
    value of each of ``kinds`` (none: a read of no values) that returns the queryset. A
    read that cannot be compiled raises ``AssertionError`` at its first run (a change to it
    the compiler cannot keep, which a test of the code that runs it meets), never falls
    back to the ORM without a word."""

    __slots__ = ("build", "kinds", "reads")

    def __init__(self, build: Callable[..., models.QuerySet], *kinds: type) -> None:
        self.build, self.kinds = build, kinds
        self.reads: dict[str, CompiledRead] = {}

    def read(self) -> CompiledRead:
        """The read compiled for the default connection's kind of database."""
        vendor = default_connection.vendor
        read = self.reads.get(vendor)
        if read is None:
            read = compile_read(self.build, len(self.kinds), self.kinds)
            if read is None:
                raise AssertionError(f"{self.build.__qualname__} cannot be compiled")
            self.reads[vendor] = read
        return read

    def objects(self, *values) -> list:
        return self.read().objects(values)

    def tuples(self, *values) -> list[tuple]:
        return self.read().tuples(values)

    def rows(self, *values) -> list[dict]:
        return self.read().rows(values)


class CompiledUpdate:
    """An UPDATE declared once, where the module that runs it is loaded, and compiled on its
    first run for each kind of database, as ``Compiled`` compiles a read: ``build`` is a
    function of one value of each of ``kinds`` that returns ``(queryset, changes)``, and
    ``run(*values)`` does what ``queryset.update(**changes)`` does with those values (the
    same statement, on the database the ORM writes to, a failure inside a transaction
    marking it for rollback as the ORM's does) and answers the rows it updated. Values are
    bound where the stand-ins were: a time as a ``DateTimeField`` binds it, a value of
    ``None`` where ``kinds`` allows one (a column set to NULL) as a bound NULL. An UPDATE
    that cannot be compiled (one that changes rows of other tables, or whose SQL depends on
    anything but the values) raises ``AssertionError`` at its first run."""

    __slots__ = ("build", "kinds", "returned", "updates")

    def __init__(self, build: Callable[..., tuple[models.QuerySet, dict]], *kinds: type) -> None:
        self.build, self.kinds = build, kinds
        self.updates: dict[str, tuple[str, str, tuple, tuple]] = {}
        self.returned: dict[str, tuple] = {}  # ``_returned``'s, by kind of database

    def run(self, *values) -> int:
        alias, sql, params = self._statement(values)
        with (
            transaction.mark_for_rollback_on_error(using=alias),
            prepared.cursor(connections[alias]) as cursor,
        ):
            cursor.execute(sql, params)
            return cursor.rowcount

    def returning(self, *values) -> list[models.Model]:
        """What ``run`` does, answering the rows it updated as they are after it, instances
        of the queryset's model built as the ORM builds a row it reads (every concrete
        field, no related object): the UPDATE and the read of its rows in one statement
        (``UPDATE … RETURNING``, which PostgreSQL and SQLite take)."""
        alias, sql, params = self._statement(values)
        connection = connections[alias]
        model, names, clause, converters = self.returned.get(connection.vendor) or self._returned(
            connection
        )
        with (
            transaction.mark_for_rollback_on_error(using=alias),
            prepared.cursor(connection) as cursor,
        ):
            cursor.execute(sql + clause, params)
            fetched = cursor.fetchall()
        answer = []
        for row in fetched:
            converted = []
            for value, steps in zip(row, converters, strict=True):
                for convert, expression in steps:
                    value = convert(value, expression, connection)
                converted.append(value)
            answer.append(model.from_db(alias, names, converted))
        return answer

    def _returned(self, connection) -> tuple:
        """``returning``'s model, its fields' names, its clause and each column's
        converters, made once for each kind of database."""
        model = self.build(*(stand_in(kind, 0, n) for n, kind in enumerate(self.kinds)))[0].model
        quote, table = connection.ops.quote_name, model._meta.db_table
        fields = model._meta.concrete_fields
        clause = " RETURNING " + ", ".join(f"{quote(table)}.{quote(f.column)}" for f in fields)
        converters = tuple(tuple(column_converters(f, table, connection)) for f in fields)
        names = [f.attname for f in fields]
        self.returned[connection.vendor] = (model, names, clause, converters)
        return self.returned[connection.vendor]

    def _statement(self, values: tuple) -> tuple[str, str, list]:
        """The database alias, the SQL and its parameters of the UPDATE with ``values``."""
        vendor = default_connection.vendor
        update = self.updates.get(vendor)
        if update is None:
            update = compile_update(self.build, self.kinds)
            if update is None:
                raise AssertionError(f"{self.build.__qualname__} cannot be compiled")
            self.updates[vendor] = update
        alias, sql, params, places = update
        params = list(params)
        for index, which, bind in places:
            value = values[which]
            params[index] = None if value is None else bind(value)
        return alias, sql, params


def compile_update(
    build: Callable[..., tuple[models.QuerySet, dict]], kinds: tuple[type, ...]
) -> tuple[str, str, tuple, tuple] | None:
    """The SQL of the UPDATE ``build(*values)`` describes, compiled once as ``compile_read``
    compiles a read (two compilations with different stand-ins, which must differ exactly
    where the stand-ins are): ``(alias, sql, params, places)``, or None when it cannot be
    kept. The statement is the one ``QuerySet.update`` makes."""
    sets = [tuple(stand_in(kind, which, n) for n, kind in enumerate(kinds)) for which in (0, 1)]
    compiled = []
    for stand_ins in sets:
        queryset, changes = build(*stand_ins)
        queryset._for_write = True
        query = queryset.query.chain(UpdateQuery)
        query.add_update_values(changes)
        query.annotations = {}
        if query.related_updates or query.order_by:
            return None
        compiler = query.get_compiler(queryset.db)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:  # a WHERE nothing can match (a stand-in out of its range)
            return None
        if not sql:
            return None
        compiled.append((queryset.db, compiler.connection, sql, tuple(params)))
    (alias, connection, sql, params), (_, _, other_sql, other_params) = compiled
    places = _places(sql, params, other_sql, other_params, sets, kinds, connection)
    if places is None or {which for _, which, _ in places} != set(range(len(kinds))):
        return None
    params = tuple(value.value if isinstance(value, Enum) else value for value in params)
    return alias, sql, params, tuple(places)


#: ``update_where``'s compiled UPDATEs, by kind of database, model and shape (the names
#: matched and set); None for a shape that takes the ORM's own update.
_SHAPES: dict[tuple, CompiledUpdate | None] = {}


def update_where(model: type[models.Model], where: dict, changes: dict) -> int:
    """``model.objects.filter(**where).update(**changes)``, answering the rows updated, with
    one ``CompiledUpdate`` for each shape of the call: the names ``where`` matches (each a
    field equal to its value, or ``pk``) and those ``changes`` sets, and which values set
    A shape whose values are all plain values of their fields' kinds (a key, a text, a whole
    number, a number with a fraction, a time, a JSON value; None for a value set) is
    compiled at its first run; any other (a related object, a truth value, an expression,
    None to match, a field with a JSON encoder of its own), or one the compiler cannot keep,
    takes the ORM's own update, the same statement built again."""
    key = (default_connection.vendor, model, *where, "=", *changes)
    try:
        update = _SHAPES[key]
    except KeyError:
        update = _SHAPES[key] = _shaped_update(model, tuple(where), changes)
    if update is None or None in where.values():
        return model.objects.filter(**where).update(**changes)
    return update.run(*where.values(), *changes.values())


def _shaped_update(model, matched: tuple, changes: dict) -> CompiledUpdate | None:
    """The shape's update, compiled for the default connection's kind of database; None
    when its values are not all plain or its statement cannot be kept."""
    kinds = [value_kind(model, name) for name in matched]
    kinds += [value_kind(model, name, value) for name, value in changes.items()]
    if None in kinds:
        return None
    names = tuple(changes)
    count = len(matched)

    def build(*values):
        where = dict(zip(matched, values[:count], strict=True))
        return model.objects.filter(**where), dict(zip(names, values[count:], strict=True))

    build.__qualname__ = f"update_where({model.__name__}, {matched}, {names})"
    update = CompiledUpdate(build, *kinds)
    compiled = compile_update(build, tuple(kinds))
    if compiled is None:
        return None
    update.updates[default_connection.vendor] = compiled
    return update


#: The kind of value of each field class ``update_where`` binds (subclasses included).
_KINDS = (
    (models.UUIDField, UUID),
    (models.DateTimeField, datetime),
    (models.FloatField, float),
    (models.BooleanField, None),  # no two stand-ins of a truth value tell places apart
    (models.IntegerField, int),  # the auto, big, small and positive ones too
    (models.CharField, str),
    (models.TextField, str),
    (models.JSONField, dict),
)


def value_kind(model, name: str, value=0) -> type | None:
    """The kind of ``name``'s values on ``model`` as ``update_where`` binds them, or None
    when it binds none of them: an unknown name, a lookup beyond equality, a field of
    another class, a relation given as an object (by its key or None, it is its key's)."""
    try:
        field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    except models.FieldDoesNotExist:
        return None
    if field.is_relation:
        if not field.many_to_one or isinstance(value, models.Model):
            return None
        field = field.target_field
    if isinstance(field, models.JSONField) and field.encoder:
        return None  # its own encoder: its texts need not be the stand-in's
    for cls, kind in _KINDS:
        if isinstance(field, cls):
            return Positive if field.get_internal_type().startswith("Positive") else kind
    return None


def refresh_from(obj: models.Model, fresh: models.Model) -> None:
    """Do to ``obj`` what ``obj.refresh_from_db()`` does with the instance it reads, given
    ``fresh``, the same row read by a compiled read (its ``select_related`` objects
    included): every field's value copied, a relation's cached object taken from ``fresh``
    or dropped, the cached reverse relations and prefetches dropped. ``fresh`` is read
    whole: a field deferred on ``obj`` is loaded too."""
    obj._prefetched_objects_cache = {}
    for field in obj._meta.concrete_fields:
        setattr(obj, field.attname, getattr(fresh, field.attname))
        if field.is_relation:
            if field.is_cached(fresh):
                field.set_cached_value(obj, field.get_cached_value(fresh))
            elif field.is_cached(obj):
                field.delete_cached_value(obj)
    for relation in (*obj._meta.related_objects, *obj._meta.private_fields):
        if relation.is_relation and relation.is_cached(obj):
            relation.delete_cached_value(obj)
    obj._state.db = fresh._state.db


def prefetched(obj: models.Model, name: str, objects: list) -> None:
    """Leave ``objects`` as ``obj``'s related objects ``name`` (a reverse relation), as
    ``prefetch_related_objects([obj], name)`` leaves the ones it reads: ``obj.<name>.all()``
    answers them, and a prefetch of ``name`` reads nothing more."""
    queryset = getattr(obj, name).all()
    queryset._result_cache, queryset._prefetch_done = list(objects), True
    if not hasattr(obj, "_prefetched_objects_cache"):
        obj._prefetched_objects_cache = {}
    obj._prefetched_objects_cache[name] = queryset


# --- inserts --------------------------------------------------------------------------------

#: The INSERT of a new row of a model, by model and kind of database: its SQL and the
#: fields whose values it takes, in order.
_INSERTS: dict[tuple, tuple[str, tuple]] = {}


def insert(obj: models.Model) -> None:
    """Write ``obj``, a new instance, as ``obj.save(force_insert=True)`` would, in one
    ``INSERT`` built once for its model and kind of database rather than built and compiled
    at every save: each field's value is what ``save`` writes (``pre_save``, then
    ``get_db_prep_save``), and the values the database chooses (an auto key) are read back.

    For a plain model (no ``save`` of its own, no receiver of its save signals, no parent
    model, no auto key given): the rows nearly every change writes, audit events,
    operations, events, VMs. Any other instance is saved by ``save`` itself, so nothing
    that listens or that ``save`` does beyond the one row is skipped."""
    insert_many([obj])


def insert_many(objs: list[models.Model]) -> None:
    """``insert`` of every one of ``objs``, new instances of one model, in one ``INSERT`` of
    as many rows (built once for each count) where the database answers the values it chose
    in the order of the rows, as ``bulk_create`` takes them (PostgreSQL, SQLite); one by
    one elsewhere. Instances ``insert`` leaves to ``save`` are saved, one by one."""
    if not objs:
        return
    model = type(objs[0])
    meta = model._meta
    returned = meta.db_returning_fields
    plain = not (
        model.save is not models.Model.save
        or meta.parents
        or any(s.has_listeners(model) for s in (models.signals.pre_save, models.signals.post_save))
    )
    rows = []
    for obj in objs:
        if plain and not any(getattr(obj, f.attname) is not None for f in returned):
            rows.append(obj)
        else:
            obj.save(force_insert=True)
    if not rows:
        return
    using = router.db_for_write(model, instance=rows[0])  # where ``save`` writes them
    connection = connections[using]
    in_order = connection.vendor in ("postgresql", "sqlite")
    for chunk in [rows] if in_order else [[obj] for obj in rows]:
        sql, fields = _insert_statement(model, connection, len(chunk))
        params = [
            field.get_db_prep_save(field.pre_save(obj, True), connection)
            for obj in chunk
            for field in fields
        ]
        with prepared.cursor(connection) as cursor:
            cursor.execute(sql, params)
            if returned:
                for obj, row in zip(chunk, cursor.fetchall(), strict=True):
                    for field, value in zip(returned, row, strict=True):
                        setattr(obj, field.attname, value)
        for obj in chunk:
            obj._state.adding, obj._state.db = False, using


def _insert_statement(model, connection, rows: int = 1) -> tuple[str, tuple]:
    """The INSERT of ``rows`` new rows of ``model`` (``RETURNING`` the values the database
    chooses) and the fields whose values each row takes, in order: built once per kind of
    database and count."""
    key = (model, connection.vendor, rows)
    if key not in _INSERTS:
        quote = connection.ops.quote_name
        meta = model._meta
        returned = meta.db_returning_fields
        fields = tuple(
            f
            for f in meta.local_concrete_fields
            if f not in returned and not getattr(f, "generated", False)
        )
        columns = ", ".join(quote(f.column) for f in fields)
        values = ", ".join([f"({', '.join(['%s'] * len(fields))})"] * rows)
        sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {values}"
        if returned:
            sql += " RETURNING " + ", ".join(quote(f.column) for f in returned)
        _INSERTS[key] = (sql, fields)
    return _INSERTS[key]
