"""One generic resource class: a collection of the API described in a few lines.

A resource says where its collection is (``path``, under ``projects/{slug}/`` when
``project_scoped``), which type its items decode to (``type``), which field names one item
in its URL (``key``), which field ``find`` matches by name (``find_by``), and which verbs the
server allows (``verbs``). The methods below do the rest, the same way for every resource:

- ``list(**filters)`` iterates every page lazily (datetimes and dates in filters are sent
  as ISO 8601; ``None`` filters are left out);
- ``get(key)``, ``find(name_or_key)`` (``NotFound`` when nothing matches),
  ``create(*args, **fields)`` (positional arguments fill ``create_args`` in order; ``None``
  fields are left out, so the server's defaults apply), ``update(key, **fields)`` (PATCH),
  ``delete(key)`` and ``_action(key, name, body)`` for a custom POST.

A verb the server does not allow for a resource raises ``NotSupported`` before any request
(pynetbox and openstacksdk do the same with their ``allow_*`` flags). Project-scoped calls
take ``project=`` (a slug) or use the client's project.

Adding a resource: a dataclass in ``kumo_sdk.types``, a subclass here in
``kumo_sdk.resources`` naming ``path``, ``type`` and ``verbs``, and one line on ``Client``
(``shares = bind(Shares)``). ``tests/sdk/test_schema_drift.py`` then checks the type's
fields and the path against the server's OpenAPI schema.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from kumo_sdk import errors
from kumo_sdk.types import decode

if TYPE_CHECKING:
    from kumo_sdk.client import Client

T = TypeVar("T")

UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)

LIST, GET, CREATE, UPDATE, DELETE = "list", "get", "create", "update", "delete"
READ = frozenset({LIST, GET})
CRUD = frozenset({LIST, GET, CREATE, UPDATE, DELETE})


def is_uuid(value: str) -> bool:
    return bool(UUID_RE.match(value))


def encode(value: Any) -> Any:
    """A value as JSON or a query string carries it: datetimes and dates in ISO 8601."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def missing(what: str, name: str, project: str | None) -> errors.NotFound:
    where = f" in project {project}" if project else ""
    return errors.NotFound(404, "not_found", f"no {what} {name!r}{where}")


class Resource(Generic[T]):
    """A collection of the API; subclasses set the class attributes and add custom actions."""

    path: ClassVar[str]  # the collection's path, relative to /api/v1/ or to the project
    type: ClassVar[type]  # the dataclass its items decode to
    project_scoped: ClassVar[bool] = True  # under projects/{slug}/
    key: ClassVar[str] = "id"  # the field that names an item in its URL
    uuid_key: ClassVar[bool] = False  # the key is a UUID: find() tries it as the key first
    find_by: ClassVar[str | None] = "name"  # the field find() matches (None: only the key)
    create_args: ClassVar[tuple[str, ...]] = ("name",)  # create()'s positional fields
    verbs: ClassVar[frozenset[str]] = READ
    noun: ClassVar[str] = ""  # for messages; the type's name in words unless given
    update_method: ClassVar[str] = "PATCH"  # or PUT, where the API replaces the item whole

    def __init__(self, client: Client) -> None:
        self._c = client

    # --- paths -------------------------------------------------------------------------------

    def _base(self, project: str | None) -> str:
        if self.project_scoped:
            return self._c.project_path(project, self.path)
        return self.path

    def _item(self, key: Any, project: str | None) -> str:
        return f"{self._base(project)}{key}/"

    def _unscoped(self, project: str | None, fields: dict[str, Any]) -> dict[str, Any]:
        """Outside a project's path, ``project=`` is a field like any other (a token's scope,
        the project an operator grants points to or filters by)."""
        if not self.project_scoped and project is not None:
            return {**fields, "project": project}
        return fields

    def _allow(self, verb: str) -> None:
        if verb not in self.verbs:
            raise errors.NotSupported(f"{self._noun()}: {verb} is not offered by the API")

    def _noun(self) -> str:
        return self.noun or re.sub(r"(?<!^)(?=[A-Z])", " ", self.type.__name__).lower()

    def _decode(self, body: dict[str, Any]) -> T:
        return decode(self.type, body)

    # --- the verbs ---------------------------------------------------------------------------

    def list(self, *, project: str | None = None, **filters: Any) -> Iterator[T]:
        """Every item, page by page as they are read, in the server's order."""
        self._allow(LIST)
        filters = self._unscoped(project, filters)
        params = {k: encode(v) for k, v in filters.items() if v is not None}
        return (self._decode(item) for item in self._c.paginate(self._base(project), **params))

    def get(self, key: Any, *, project: str | None = None) -> T:
        self._allow(GET)
        return self._decode(self._c.get(self._item(key, project)))

    def find(self, name_or_key: str, *, project: str | None = None) -> T:
        """The item with this key (a UUID key is tried first), or the first whose
        ``find_by`` field is this name (``NotFound`` otherwise)."""
        if (self.uuid_key and is_uuid(name_or_key)) or self.find_by is None:
            return self.get(name_or_key, project=project)
        for item in self.list(project=project, **self._find_filters(name_or_key)):
            if getattr(item, self.find_by) == name_or_key and self._findable(item):
                return item
        raise missing(self._noun(), name_or_key, project or self._c.project)

    def _find_filters(self, name: str) -> dict[str, Any]:
        """Filters that narrow find()'s listing on the server (none unless a subclass knows
        the collection filters by its ``find_by`` field)."""
        return {}

    def _findable(self, item: T) -> bool:
        return True

    def create(
        self,
        *args: Any,
        project: str | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> T:
        """A new item from ``fields`` (and ``create_args`` filled from ``args``); the
        server names any field at fault in ``InvalidInput``."""
        self._allow(CREATE)
        if len(args) > len(self.create_args):
            raise TypeError(f"{self._noun()}.create takes {self.create_args} positionally")
        fields.update(zip(self.create_args, args, strict=False))
        fields = self._unscoped(project, fields)
        body = {k: encode(v) for k, v in fields.items() if v is not None}
        answer = self._c.post(self._base(project), body, idempotency_key=idempotency_key)
        return self._decode(answer)

    def update(self, key: Any, *, project: str | None = None, **fields: Any) -> T:
        """Change the given fields (PATCH; the others stay), or with ``update_method`` PUT
        give them all."""
        self._allow(UPDATE)
        body = {k: encode(v) for k, v in fields.items()}
        return self._decode(
            self._c.request(self.update_method, self._item(key, project), json=body).json()
        )

    def delete(self, key: Any, *, project: str | None = None) -> None:
        self._allow(DELETE)
        self._c.delete(self._item(key, project))

    def _action(self, key: Any, name: str, body: Any = None, *, project: str | None = None) -> Any:
        """POST to the item's custom action ``name``; the answer's JSON."""
        return self._c.post(f"{self._item(key, project)}{name}/", body)


class Singleton(Resource[T]):
    """One object at ``path`` rather than a collection (a project's quota, its forecast):
    ``get()`` reads it, ``update(**fields)`` changes it where ``verbs`` allows."""

    find_by = None
    verbs = frozenset({GET})

    def get(self, *, project: str | None = None) -> T:  # type: ignore[override]
        self._allow(GET)
        return self._decode(self._c.get(self._base(project)))

    def update(self, *, project: str | None = None, **fields: Any) -> T:  # type: ignore[override]
        self._allow(UPDATE)
        body = {k: encode(v) for k, v in fields.items()}
        return self._decode(
            self._c.request(self.update_method, self._base(project), json=body).json()
        )


class Namespace:
    """A group of resources under one attribute of the client (``kumo.admin.hosts``)."""

    def __init__(self, client: Client) -> None:
        self._client = client


class bind:
    """``hosts = bind(Hosts)`` on ``Client`` or a ``Namespace``: the resource, made for the
    client on first use and kept."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        made = self.cls(getattr(obj, "_client", obj))
        obj.__dict__[self.name] = made
        return made
