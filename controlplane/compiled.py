"""Statements the ORM builds once and Kumo runs again with other values.

Django builds and compiles a queryset's SQL at every call: for the small reads that run on
every request, report or release, that costs more than the database takes to answer them.
``compile_read(build, count)`` calls ``build`` (a function of ``count`` values that returns a
``values()`` or ``values_list()`` queryset) twice with different stand-ins and keeps the SQL
when the two compilations differ only where the stand-ins are: each later run binds its own
values there and runs that SQL, its rows converted as the ORM's compiler converts them. The
statement stays the ORM's own, so it cannot drift from the queryset it was compiled from.

A read runs as a statement PostgreSQL keeps prepared on the connection
(``controlplane.prepared``).

Used by the API's list and detail answers (``controlplane.api.fastread``) and by the
scheduler's read of one host (``compute.placement``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, models
from django.db.models.fields.json import KeyTransform
from django.db.models.query import ValuesIterable, ValuesListIterable

from controlplane import prepared

# The stand-ins of a compiled read's per-request values, one set per compilation: the places
# where the two compilations' parameters differ, each by its own stand-in, are theirs. They are
# negative, as no key of Kumo's is, so no constant of the query can be taken for one (and
# within a 32-bit integer's range, which Django checks a key against).
STAND_INS = ((-2_013_560_101, -2_013_560_102), (-2_013_560_111, -2_013_560_112))


class CompiledRead:
    """A ``values()`` or ``values_list()`` query's SQL compiled once, and how to run it again
    with other values where its stand-ins were (``compile_read``): rows as ``values()``
    answers them (``rows``) or as tuples in the same order (``tuples``), each column converted
    as the ORM's compiler converts it. Only the SQL text and constants are kept between runs;
    every value a run is given is a bound parameter of that run."""

    __slots__ = ("alias", "converters", "model", "names", "ordered", "params", "places", "sql")

    def __init__(self, *, model, alias, sql, params, places, names, converters, ordered) -> None:
        self.model, self.alias, self.sql, self.params = model, alias, sql, params
        self.places, self.names, self.converters, self.ordered = places, names, converters, ordered

    def rows(self, values: tuple, suffix: str = "") -> list[dict]:
        fetched, connection = self._fetch(values, suffix)
        names, steps = self.names, self._steps(connection)
        answer = []
        for row in fetched:
            if steps:
                row = list(row)
                for position, convert in steps:
                    row[position] = convert(row[position])
            answer.append(dict(zip(names, row, strict=True)))
        return answer

    def tuples(self, values: tuple, suffix: str = "") -> list[tuple]:
        """The rows as tuples of the columns ``names`` says, in that order (what
        ``values_list()`` answers)."""
        fetched, connection = self._fetch(values, suffix)
        steps = self._steps(connection)
        if not steps:
            return fetched
        answer = []
        for row in fetched:
            row = list(row)
            for position, convert in steps:
                row[position] = convert(row[position])
            answer.append(tuple(row))
        return answer

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
        for row in fetched:
            if steps:
                row = list(row)
                for position, convert in steps:
                    row[position] = convert(row[position])
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
        params = list(self.params)
        for index, which in self.places:
            params[index] = values[which]
        connection = connections[self.alias]
        return prepared.fetch(connection, self.sql + suffix, params), connection

    def _steps(self, connection) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
        """(column, function of its value) for each column the ORM's compiler converts."""
        return tuple(
            (position, _column_converter(functions, expression, connection))
            for position, (functions, expression) in self.converters
        )


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


def compile_read(build: Callable[..., models.QuerySet], count: int) -> CompiledRead | None:
    """The SQL of ``build(*values)``, a ``values()`` or ``values_list()`` queryset of
    ``count`` values, compiled once. ``build`` is called twice with different stand-ins, and
    the SQL is kept only when both compile to the same text whose parameters differ exactly
    where the stand-ins are, every stand-in has a place, and every other parameter is a
    constant (text, a number, a truth value, or one of a model's choices): a query whose SQL
    or constants depend on anything else (a time, a value the stand-ins don't reach) has
    none (None), and keeps the ORM's path."""
    compiled = []
    for stand_ins in STAND_INS:
        queryset = build(*stand_ins[:count])
        rows_as = None if queryset is None else queryset._iterable_class
        if rows_as not in (ValuesIterable, ValuesListIterable):
            return None
        compiler = queryset.query.get_compiler(using=queryset.db)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            return None
        compiled.append((queryset, compiler, sql, tuple(params)))
    (queryset, compiler, sql, params), (_, _, other_sql, other_params) = compiled
    if sql != other_sql or len(params) != len(other_params):
        return None
    first_set, second_set = (stand_ins[:count] for stand_ins in STAND_INS)
    places = []
    for index, (first, second) in enumerate(zip(params, other_params, strict=True)):
        which = first_set.index(first) if type(first) is int and first in first_set else None
        if which is not None and second == second_set[which]:
            places.append((index, which))
        elif first != second or not isinstance(first, str | int) or second in second_set:
            return None
    # A choice's plain value: psycopg dumps a str faster than a str that is an Enum.
    params = tuple(value.value if isinstance(value, Enum) else value for value in params)
    fields = [column[0] for column in compiler.select[: compiler.col_count]]
    if {which for _, which in places} != set(range(count)) or compiler.has_composite_fields(fields):
        return None
    query = queryset.query
    if query.selected:
        names = tuple(query.selected)
    else:
        names = (*query.extra_select, *query.values_select, *query.annotation_select)
    if len(names) != len(fields):
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
    )
