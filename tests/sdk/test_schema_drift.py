"""The SDK cannot drift from the API: every resource of ``kumo_sdk`` is checked against the
OpenAPI schema drf-spectacular generates in-process from the views (the one ``/api/schema/``
serves).

- every resource's path is a path of the schema, and its verbs are exactly what the schema
  offers there (list and create on the collection; get, update and delete on an item);
- every collection of the schema under ``/api/v1/`` is some resource's (or is named below
  with the reason it is not one);
- every type's fields are exactly the properties the schema gives its answers (the item's
  GET, the collection's GET and the creation's answer), nested types included: a field the
  API serves that the type misses fails, and so does a field the type names that the API
  does not serve (unless the type marks it ``BEYOND_SCHEMA``, saying why);
- every dataclass of ``kumo_sdk.types`` is checked by one of the above.
"""

import dataclasses
import re
import typing
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator
from kumo_sdk import Client, types
from kumo_sdk.resource import (
    CREATE,
    DELETE,
    GET,
    LIST,
    UPDATE,
    Namespace,
    Resource,
    Singleton,
    bind,
)

API = "/api/v1/"

# Paths of the schema that are not a resource of the SDK, and why.
NOT_RESOURCES = {
    "user/": "Client.whoami() (one object, not a collection)",
    "invitations/accept/": "Invitations.accept(token): an action, not a collection",
    "auth/login/": "mint_token logs in and out with the session, once",
    "auth/logout/": "mint_token logs in and out with the session, once",
    "metadata/spot/instance-action": "called by a guest with its metadata token, not by users",
    "metadata/spot/acknowledge": "called by a guest with its metadata token, not by users",
    "metadata/spot/checkpoint": "called by a guest with its metadata token, not by users",
}

# Answers that are not a resource's items: (type, schema path, method).
OTHER_ANSWERS = [
    (types.User, "/api/v1/user/", "get"),
    (types.InvoiceVerification, "/api/v1/projects/{project_slug}/invoices/{id}/verify/", "get"),
    (types.Quota, "/api/v1/admin/projects/{slug}/quota/", "get"),
    (types.ConsoleTicket, "/api/v1/projects/{project_slug}/vms/{id}/console/", "post"),
]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def resources() -> list[tuple[str, type[Resource]]]:
    """Every resource bound on Client, and in its namespaces, by its attribute path."""
    found = []

    def walk(owner: type, prefix: str) -> None:
        for name, value in vars(owner).items():
            if not isinstance(value, bind):
                continue
            if issubclass(value.cls, Namespace):
                walk(value.cls, f"{prefix}{name}.")
            else:
                found.append((f"{prefix}{name}", value.cls))

    walk(Client, "kumo.")
    return found


RESOURCES = resources()


def collection_path(cls: type[Resource]) -> str:
    return API + ("projects/{project_slug}/" if cls.project_scoped else "") + cls.path


def item_path(schema: dict[str, Any], cls: type[Resource]) -> str | None:
    base = re.escape(collection_path(cls))
    pattern = re.compile(base + r"\{[^}/]+\}/$")
    matches = [p for p in schema["paths"] if pattern.match(p)]
    assert len(matches) <= 1, matches
    return matches[0] if matches else None


def answer_schemas(schema: dict[str, Any], path: str, methods: tuple[str, ...]) -> list[dict]:
    """The JSON bodies the schema gives the successful answers of these methods at path
    (a page's items for a paginated list)."""
    found = []
    for method in methods:
        operation = schema["paths"].get(path, {}).get(method)
        if operation is None:
            continue
        for status, answer in operation["responses"].items():
            if not status.startswith("2"):
                continue
            body = answer.get("content", {}).get("application/json", {}).get("schema")
            if body is None:
                continue
            body = resolve(schema, body)
            props = body.get("properties", {})
            if set(props) >= {"count", "results"}:  # a page: its items
                body = resolve(schema, props["results"]["items"])
            found.append(body)
    return found


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return resolve(schema, schema["components"]["schemas"][node["$ref"].split("/")[-1]])
    if "allOf" in node and len(node["allOf"]) == 1:
        return resolve(schema, node["allOf"][0])
    return node


def nested_type(hint: Any) -> type | None:
    """The dataclass a field holds (itself, in a list, or optional), if any."""
    for arg in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(arg):
            return arg
        for inner in typing.get_args(arg):
            if dataclasses.is_dataclass(inner):
                return inner
    return None


def compare(schema: dict[str, Any], cls: type, bodies: list[dict], where: str, seen: set) -> list:
    """What differs between the dataclass ``cls`` and the union of these object schemas."""
    seen.add(cls)
    properties: dict[str, dict] = {}
    for body in bodies:
        properties.update(body.get("properties", {}))
    hints = typing.get_type_hints(cls)
    fields = {
        f.name: f
        for f in dataclasses.fields(cls)
        if f.name != "raw" and not f.metadata.get("beyond_schema")
    }
    # A field marked BEYOND_SCHEMA may still be in some answers (a VM's ``operation``: in
    # the create's answer only, never in the operators' list).
    beyond = {f.name for f in dataclasses.fields(cls) if f.metadata.get("beyond_schema")}
    problems = []
    for name in sorted(set(properties) - set(fields) - beyond):
        problems.append(f"{where}: {cls.__name__} misses the field {name!r} the API serves")
    for name in sorted(set(fields) - set(properties)):
        problems.append(f"{where}: {cls.__name__}.{name} is not served by the API")
    for name in sorted(set(fields) & set(properties)):
        inner = nested_type(hints[name])
        if inner is None:
            continue
        node = resolve(schema, properties[name])
        if node.get("type") == "array":
            node = resolve(schema, node["items"])
        for key in ("oneOf", "anyOf"):
            objects = [resolve(schema, n) for n in node.get(key, [])]
            node = next((n for n in objects if "properties" in n), node)
        problems += compare(schema, inner, [node], f"{where}.{name}", seen)
    return problems


CHECKED: set[type] = set()


@pytest.mark.parametrize(("attribute", "cls"), RESOURCES, ids=[a for a, _ in RESOURCES])
def test_a_resource_is_a_path_of_the_schema_with_its_verbs(schema, attribute, cls):
    base = collection_path(cls)
    assert base in schema["paths"], f"{attribute}: {base} is not a path of the API"
    offered = set(schema["paths"][base])
    if issubclass(cls, Singleton):
        assert (GET in cls.verbs) == ("get" in offered), attribute
        assert (UPDATE in cls.verbs) == (cls.update_method.lower() in offered), attribute
        return
    assert (LIST in cls.verbs) == ("get" in offered), f"{attribute}: list vs {sorted(offered)}"
    assert (CREATE in cls.verbs) == ("post" in offered), f"{attribute}: create vs {offered}"
    item = item_path(schema, cls)
    on_item = set(schema["paths"][item]) if item else set()
    assert (GET in cls.verbs) == ("get" in on_item), f"{attribute}: get vs {sorted(on_item)}"
    assert (DELETE in cls.verbs) == ("delete" in on_item), f"{attribute}: delete vs {on_item}"
    assert (UPDATE in cls.verbs) == (cls.update_method.lower() in on_item), (
        f"{attribute}: update ({cls.update_method}) vs {sorted(on_item)}"
    )
    if item is not None:
        param = re.search(r"\{([^}]+)\}/$", item).group(1)
        assert param in (cls.key, f"project_{cls.key}"), (
            f"{attribute}: items are named by {param} in the URL, the SDK uses {cls.key}"
        )


@pytest.mark.parametrize(("attribute", "cls"), RESOURCES, ids=[a for a, _ in RESOURCES])
def test_a_resource_type_has_exactly_the_fields_the_api_serves(schema, attribute, cls):
    base = collection_path(cls)
    bodies = answer_schemas(schema, base, ("get", "post", "put", "patch"))
    item = None if issubclass(cls, Singleton) else item_path(schema, cls)
    if item is not None:
        bodies += answer_schemas(schema, item, ("get", "put", "patch"))
    assert bodies, f"{attribute}: the schema describes no answer at {base}"
    problems = compare(schema, cls.type, bodies, attribute, CHECKED)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("cls", "path", "method"), OTHER_ANSWERS, ids=lambda v: str(v))
def test_other_answers_have_exactly_the_fields_the_api_serves(schema, cls, path, method):
    bodies = answer_schemas(schema, path, (method,))
    assert bodies, f"the schema describes no answer for {method} {path}"
    problems = compare(schema, cls, bodies, f"{method} {path}", CHECKED)
    assert not problems, "\n".join(problems)


def test_every_collection_of_the_api_is_a_resource(schema):
    covered = [collection_path(cls) for _, cls in RESOURCES]
    uncovered = []
    for path in schema["paths"]:
        rest = path.removeprefix(API)
        if rest in NOT_RESOURCES:
            continue
        if not any(path.startswith(base) for base in covered):
            uncovered.append(path)
    assert not uncovered, f"paths of the API no SDK resource reaches: {uncovered}"


def test_every_type_is_checked(schema):
    """Run after the tests above (same module): each dataclass of kumo_sdk.types was
    compared with the schema, as a resource's type, another answer or a nested field."""
    for _, cls in RESOURCES:
        bodies = answer_schemas(schema, collection_path(cls), ("get", "post"))
        item = None if issubclass(cls, Singleton) else item_path(schema, cls)
        if item is not None:
            bodies += answer_schemas(schema, item, ("get", "put", "patch"))
        compare(schema, cls.type, bodies, "", CHECKED)
    for cls, path, method in OTHER_ANSWERS:
        compare(schema, cls, answer_schemas(schema, path, (method,)), "", CHECKED)
    every = {
        value
        for value in vars(types).values()
        if isinstance(value, type) and dataclasses.is_dataclass(value)
    }
    assert every - CHECKED == set()
