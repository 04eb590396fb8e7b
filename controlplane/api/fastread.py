"""The read path of list and detail answers, without the work that does not serve the reader.

For a page of 100 rows, DRF's ``ModelSerializer`` spends most of a request building its
fields again for every request (``get_fields`` introspects the model each time) and the ORM
builds a model object per row that the serializer only reads a few columns of. A *read plan*
does that work once per serializer class: for each field it keeps the column it reads (a
column of the model, or of a model one or more foreign keys away) and the field's own
``to_representation``. A list or detail answer then reads exactly those columns with
``QuerySet.values()`` and converts each value with the very function DRF would have used, so
the JSON is the same, byte for byte (``tests/controlplane/test_fastread.py`` compares both
paths on every list endpoint with seeded rows).

A serializer gets no plan, and keeps DRF's path, when any field is more than a column read: a
method field, a nested serializer, a many-to-many relation, a source that is a property or
``*``, or a class that overrides ``to_representation``. Nothing is guessed: a field the
planner does not understand means no plan.

On PostgreSQL a plain list or detail of a project's objects does not even build its ORM query
per request: its SQL is compiled once per view class (``CompiledRead``), with the project's
id, and a detail's key, as bound parameters whose places are found by compiling the query
twice with two different stand-in values. Each request only binds its own project's id (read
through the caller's membership, as the scoped queryset reads it) and runs that SQL. Its
answers are made straight from the row tuples it fetches (``CompiledRead.answers``): each
column converted as the ORM converts it, then each field as the plan converts it, with no row
dict in between.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models
from django.db.models.query import MAX_GET_RESULTS
from django.http import Http404
from django.utils import timezone
from rest_framework import ISO_8601, mixins, relations, serializers
from rest_framework.generics import get_object_or_404
from rest_framework.settings import api_settings

from controlplane.compiled import STAND_INS, CompiledRead, compile_read

_NO_PLAN = object()
_DATETIME = object()  # a DateTimeField in ISO 8601, converted in the answer's time zone
_plans: dict[type, ReadPlan | None] = {}


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """How to answer with a serializer class from ``values()`` rows."""

    #: (output name, values() path, converter or None for "as it is")
    fields: tuple[tuple[str, str, Callable[[Any], Any] | None], ...]
    #: the columns to read; those read as ISO 8601 text (``select``) under these keys
    paths: tuple[str, ...] = ()
    iso_keys: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, fields) -> ReadPlan:
        datetimes = dict.fromkeys(path for _, path, convert in fields if convert is _DATETIME)
        return cls(
            fields=fields,
            paths=tuple(dict.fromkeys(path for _, path, _ in fields)),
            iso_keys={path: f"kumo_iso_{i}" for i, path in enumerate(datetimes)},
        )

    def select(self, queryset: models.QuerySet) -> models.QuerySet:
        """``queryset.values()`` of the plan's columns. When the answer's time zone is UTC and
        the database PostgreSQL, each date-time comes formatted by the database as DRF would
        write it (``2026-11-24T05:06:07.000012Z``, no fraction when it is zero), instead of
        being parsed into a datetime only to be formatted again: ``render_many`` then reads
        the text as it is."""
        if not self.iso_keys or not _iso_in_sql(queryset):
            return queryset.values(*self.paths)
        parsed = {path for _, path, convert in self.fields if convert is not _DATETIME}
        iso = {key: _IsoUTC(path) for path, key in self.iso_keys.items()}
        return queryset.values(*(path for path in self.paths if path in parsed), **iso)

    def shape(self, names: tuple[str, ...]) -> tuple[tuple[str, ...], Callable, tuple]:
        """How ``render_many`` makes answers from rows of the columns ``names`` (as ``select``
        reads them), for rows as tuples in that order: the answer's field names, a function
        that picks their columns from a row, in that order, and (index, converter) of the
        fields whose value, when it is not None, is converted."""
        iso = bool(self.iso_keys) and next(iter(self.iso_keys.values())) in names
        tz = None if iso or not self.iso_keys else timezone.get_current_timezone()
        positions, converts = [], []
        for index, (_, path, convert) in enumerate(self.fields):
            if convert is _DATETIME:
                path, convert = (self.iso_keys[path], None) if iso else (path, _iso_datetime(tz))
            positions.append(names.index(path))
            if convert is not None:
                converts.append((index, convert))
        if len(positions) == 1:
            (position,) = positions
            pick = lambda row: (row[position],)  # noqa: E731 (itemgetter of one: no tuple)
        else:
            pick = itemgetter(*positions) if positions else (lambda row: ())
        return tuple(name for name, _, _ in self.fields), pick, tuple(converts)

    def render(self, row: dict) -> dict:
        return self.render_many((row,))[0]

    def render_many(self, rows: Iterable[dict]) -> list[dict]:
        rows = rows if isinstance(rows, list) else list(rows)
        if rows and self.iso_keys and next(iter(self.iso_keys.values())) in rows[0]:
            # The date-times came as text (``select``): each is read as it is.
            fields = [
                (name, self.iso_keys[path], None) if convert is _DATETIME else (name, path, convert)
                for name, path, convert in self.fields
            ]
        else:
            # Converters that depend on the request's time zone are bound once per answer.
            tz = timezone.get_current_timezone()
            fields = [
                (name, path, _iso_datetime(tz) if convert is _DATETIME else convert)
                for name, path, convert in self.fields
            ]
        return [
            {
                name: value if (value := row[path]) is None or convert is None else convert(value)
                for name, path, convert in fields
            }
            for row in rows
        ]


class PlannedData:
    """What ``get_serializer`` returns on the read path: its ``data`` is the answer."""

    __slots__ = ("data",)

    def __init__(self, data) -> None:
        self.data = data


def plan_for(serializer_class: type[serializers.BaseSerializer]) -> ReadPlan | None:
    """The read plan of ``serializer_class``, or None when it must keep DRF's path."""
    plan = _plans.get(serializer_class, _NO_PLAN)
    if plan is _NO_PLAN:
        plan = _plans[serializer_class] = _compile(serializer_class)
    return plan


def _compile(serializer_class) -> ReadPlan | None:
    if not issubclass(serializer_class, serializers.ModelSerializer):
        return None
    if serializer_class.to_representation is not serializers.Serializer.to_representation:
        return None
    model = serializer_class.Meta.model
    fields = []
    for name, field in serializer_class().fields.items():
        if field.write_only:
            continue
        planned = _plan_field(model, field)
        if planned is None:
            return None
        fields.append((name, *planned))
    return ReadPlan.of(tuple(fields))


def _column_path(model, attrs: list[str]) -> tuple[str, bool] | None:
    """The ``values()`` path of ``attrs`` read from ``model`` (forward foreign keys, then a
    concrete column) and whether it crosses a nullable foreign key. None for anything else:
    properties, methods, reverse or many-to-many relations, a relation as the value."""
    path, nullable = [], False
    for i, attr in enumerate(attrs):
        try:
            field = model._meta.get_field(attr)
        except FieldDoesNotExist:
            return None
        if not field.concrete or field.many_to_many or field.one_to_many:
            return None
        if field.is_relation:
            if i == len(attrs) - 1:
                return None
            nullable = nullable or field.null
            model = field.related_model
        path.append(field.name)
    return "__".join(path), nullable


def _plan_field(model, field) -> tuple[str, Callable | None] | None:
    """(values() path, converter) for one serializer field, or None: no plan."""
    if isinstance(field, serializers.BaseSerializer | relations.ManyRelatedField):
        return None
    if field.source == "*" or isinstance(field, serializers.SerializerMethodField):
        return None
    attrs = field.source.split(".")
    if isinstance(field, relations.RelatedField):
        # Only a foreign key of the model itself, shown as its pk or one slug column.
        try:
            fk = model._meta.get_field(attrs[0])
        except FieldDoesNotExist:
            return None
        if len(attrs) != 1 or not fk.concrete or not (fk.many_to_one or fk.one_to_one):
            return None
        if type(field) is relations.PrimaryKeyRelatedField and field.pk_field is None:
            return fk.attname, None  # DRF answers the related object's pk: the column
        slug = type(field).to_representation is relations.SlugRelatedField.to_representation
        if isinstance(field, relations.SlugRelatedField) and slug and "." not in field.slug_field:
            return f"{fk.name}__{field.slug_field}", None
        return None
    if type(field).get_attribute is not serializers.Field.get_attribute:
        return None
    found = _column_path(model, attrs)
    if found is None:
        return None
    path, nullable = found
    if nullable and (not field.allow_null or field.default is not serializers.empty):
        return None  # DRF would answer the default, or leave the field out, on a null relation
    return path, _converter(model, attrs, field)


def _converter(model, attrs: list[str], field) -> Callable | object | None:
    """The field's ``to_representation``, or a faster function that gives the same answer
    for the values the column can hold (None: the value as it is)."""
    shows = type(field).to_representation  # the function DRF would call
    column = _column(model, attrs)
    text = isinstance(column, models.CharField | models.TextField) and not column.choices
    if shows is serializers.CharField.to_representation and text:
        return None  # str(value) of a str
    if shows is serializers.ChoiceField.to_representation and all(
        isinstance(k, str) for k in field.choices
    ):
        return None  # every choice is its own string, as the column holds it
    if shows is serializers.IntegerField.to_representation and isinstance(
        column, models.IntegerField
    ):
        return None  # int(value) of an int
    big = getattr(serializers, "BigIntegerField", None)  # DRF 3.16: a big key's own field
    if (
        big is not None
        and shows is big.to_representation
        and isinstance(column, models.IntegerField)
        and not getattr(field, "coerce_to_string", api_settings.COERCE_BIGINT_TO_STRING)
    ):
        return None  # int(value) of an int, not written as a string
    if shows is serializers.BooleanField.to_representation and isinstance(
        column, models.BooleanField
    ):
        return None
    if shows is serializers.JSONField.to_representation and not field.binary:
        return None
    if (
        shows is serializers.DateTimeField.to_representation
        and isinstance(column, models.DateTimeField)
        and settings.USE_TZ
        and not hasattr(field, "timezone")
    ):
        fmt = getattr(field, "format", api_settings.DATETIME_FORMAT)
        if fmt is not None and fmt.lower() == ISO_8601:
            return _DATETIME
    return field.to_representation


def _column(model, attrs: list[str]):
    for attr in attrs[:-1]:
        model = model._meta.get_field(attr).related_model
    return model._meta.get_field(attrs[-1])


def _iso_in_sql(queryset) -> bool:
    return connections[queryset.db].vendor == "postgresql" and str(
        timezone.get_current_timezone()
    ) in ("UTC", "Etc/UTC")


class _IsoUTC(models.Func):
    """A timestamptz column as DRF's ISO 8601 text in UTC, by PostgreSQL: microseconds only
    when there are some, ``Z`` for the offset (``to_char`` pads the year to four digits, as
    Python's ``isoformat`` does)."""

    template = (
        "to_char(%(expressions)s AT TIME ZONE 'UTC', CASE WHEN to_char(%(expressions)s, 'US')"
        " = '000000' THEN 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'"
        ' ELSE \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\' END)'
    )
    output_field = models.TextField()

    def __init__(self, path: str) -> None:
        super().__init__(models.F(path))


def _iso_datetime(tz) -> Callable:
    """DRF's DateTimeField.to_representation in ISO 8601, for the aware values a
    ``DateTimeField`` column holds when ``USE_TZ`` is on."""

    def convert(value):
        text = value.astimezone(tz).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return convert


class CompiledList:
    """A list's page read through its compiled SQL (``CountingPaginator`` reads it with
    ``read_page``), answered by the plan straight from the fetched rows; ``queryset()`` is
    the queryset that SQL stands for, for Django's paginator when a page is past what the SQL
    can ask for (``answered`` then stays False: those rows are still to be rendered)."""

    __slots__ = ("answered", "compiled", "plan", "queryset", "values")

    def __init__(self, compiled: CompiledRead, values: tuple, *, plan, queryset) -> None:
        self.compiled, self.values, self.plan, self.queryset = compiled, values, plan, queryset
        self.answered = False

    @property
    def ordered(self) -> bool:
        return self.compiled.ordered

    def read_page(self, bottom: int, size: int) -> tuple[list[dict], int]:
        """The page's answers and the count of the whole list (0 when the page is empty)."""
        from controlplane.api.pagination import TOTAL

        ops = connections[self.compiled.alias].ops
        suffix = " " + ops.limit_offset_sql(bottom, bottom + size)
        answers, first = self.compiled.answers(self.plan, self.values, suffix)
        self.answered = True
        return answers, 0 if first is None else first[TOTAL]


#: per (view class, serializer class, action, database, date-times in SQL): its compiled read
_compiled: dict[tuple, CompiledRead | None] = {}


class ReadPathMixin:
    """List and retrieve through the serializer's read plan when it has one.

    Mixed into the API's base views. It takes the path only for plain ``list`` and
    ``retrieve`` actions whose view does not change how objects are fetched or shown
    (overridden ``get_object`` or ``get_serializer``, object permissions): anything else is
    DRF's path, unchanged.
    """

    def _read_plan(self) -> ReadPlan | None:
        if self.request.method != "GET" or getattr(self, "swagger_fake_view", False):
            return None
        if self.action not in ("list", "retrieve"):
            return None
        return plan_for(self.get_serializer_class())

    def _read_scope(self) -> tuple[tuple, Callable[..., models.QuerySet]] | None:
        """For a compiled read: this request's values that scope what the view reads, and
        a function that makes the view's queryset from such values; None when the view
        reads otherwise (then nothing is compiled). Base views that scope their reads
        override it."""
        return None

    def _plain_list(self) -> bool:
        """True when this list request's queryset is its view's queryset as it is, filtered
        by nothing the request gives, ordered as the view orders it."""
        return False

    def _compiled(self, plan: ReadPlan, action: str, compile_: Callable) -> tuple | None:
        """(compiled read, this request's values) of the view's ``action``, compiled on its
        view's first such request; None when it has none (then the ORM's path)."""
        scope = self._read_scope()
        if scope is None:
            return None
        values, build = scope
        key = (type(self), self.get_serializer_class(), action, _iso_zone(), self.lookup_field)
        compiled = _compiled.get(key, _NO_PLAN)
        if compiled is _NO_PLAN:
            compiled = _compiled[key] = compile_(build, len(values))
        return None if compiled is None else (compiled, values)

    def paginate_queryset(self, queryset):
        plan = self._read_plan() if isinstance(queryset, models.QuerySet) else None
        if plan is None:
            return super().paginate_queryset(queryset)
        compiled = None
        if type(self).list is mixins.ListModelMixin.list and self._plain_list():
            compiled = self._compiled(plan, "list", lambda b, n: _compile_list(self, plan, b, n))
        if compiled is None:
            page = super().paginate_queryset(plan.select(queryset))
            return None if page is None else _Rows(plan.render_many(page))
        listed = CompiledList(*compiled, plan=plan, queryset=lambda: plan.select(queryset))
        page = super().paginate_queryset(listed)
        if page is None:
            return None
        return _Rows(page if listed.answered else plan.render_many(page))

    def get_serializer(self, *args, **kwargs):
        if args and isinstance(args[0], _Rows):
            return PlannedData(list(args[0]))
        if args and isinstance(args[0], _Row):
            return PlannedData(args[0].data)
        if args and isinstance(args[0], models.QuerySet) and kwargs.get("many"):
            plan = self._read_plan()
            if plan is not None:
                return PlannedData(plan.render_many(plan.select(args[0])))
        return super().get_serializer(*args, **kwargs)

    def get_object(self):
        plan = self._read_plan() if self.action == "retrieve" else None
        if plan is None or not _plain_permissions(self):
            return super().get_object()
        lookup = self.lookup_url_kwarg or self.lookup_field
        key = self.kwargs[lookup]
        compiled = self._compiled(plan, "retrieve", lambda b, n: _compile_detail(self, plan, b, n))
        if compiled is not None:
            read, values = compiled
            value = _integer_key(read, key)
            answers = None if value is None else read.answers(plan, (*values, value))[0]
            if answers is not None and len(answers) <= 1:
                if not answers:  # as Django's get_object_or_404 says it
                    raise Http404(f"No {read.model._meta.object_name} matches the given query.")
                return _Row(answers[0])
        row = get_object_or_404(plan.select(self.get_queryset()), **{self.lookup_field: key})
        return _Row(plan.render(row))


def _iso_zone() -> bool:
    return str(timezone.get_current_timezone()) in ("UTC", "Etc/UTC")


def _compile_list(view, plan: ReadPlan, build: Callable, count: int) -> CompiledRead | None:
    """A plain list's page with its count (``counted_queryset``), without its LIMIT and
    OFFSET, which ``CompiledList`` appends as Django's compiler writes them (checked here)."""
    from controlplane.api.pagination import counted_queryset

    def page(*values):
        return counted_queryset(plan.select(view.filter_queryset(build(*values))))

    compiled = compile_read(page, count)
    if compiled is None or connections[compiled.alias].vendor != "postgresql":
        return None
    ops = connections[compiled.alias].ops
    for bottom, top in ((0, 7), (3, 10)):
        queryset = page(*STAND_INS[0][:count])[bottom:top]
        sql, _ = queryset.query.get_compiler(using=queryset.db).as_sql()
        if sql != f"{compiled.sql} {ops.limit_offset_sql(bottom, top)}":
            return None
    return compiled


def _compile_detail(view, plan: ReadPlan, build: Callable, count: int) -> CompiledRead | None:
    """A detail by an integer key, as ``QuerySet.get`` reads it (unordered, at most
    MAX_GET_RESULTS rows), the key a bound parameter after the scope's values."""
    model = build(*STAND_INS[0][:count]).model
    try:
        field = model._meta.get_field(view.lookup_field) if view.lookup_field != "pk" else None
    except FieldDoesNotExist:
        return None
    field = field or model._meta.pk
    if not isinstance(field, models.IntegerField) or not (field.primary_key or field.unique):
        return None

    def detail(*values):
        queryset = plan.select(build(*values[:-1])).filter(**{view.lookup_field: values[-1]})
        return queryset.order_by()[:MAX_GET_RESULTS]

    compiled = compile_read(detail, count + 1)
    if compiled is None or connections[compiled.alias].vendor != "postgresql":
        return None
    return compiled


def _integer_key(read: CompiledRead, key) -> int | None:
    """``key`` as the integer Django would look up, or None when Django's own path should
    read it (anything but plain digits, or a number past the column's range)."""
    if not isinstance(key, str) or not key.isascii() or not key.isdigit() or len(key) > 18:
        return None
    return int(key) if int(key) <= 2**31 - 1 else None


class _Rows(list):
    """A page already rendered by a read plan."""


class _Row:
    __slots__ = ("data",)

    def __init__(self, data: dict) -> None:
        self.data = data


def _plain_permissions(view) -> bool:
    """True when no permission of ``view`` looks at the object itself."""
    from rest_framework.permissions import BasePermission

    return all(
        type(p).has_object_permission is BasePermission.has_object_permission
        for p in view.get_permissions()
    )
