"""``decode``: a typed result from a JSON body; ``BEYOND_SCHEMA`` marks a field the server
sends but its OpenAPI schema does not describe (the schema drift test skips it)."""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import date, datetime
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")

# metadata of a field the server sends outside its OpenAPI schema; say why where it is used.
BEYOND_SCHEMA = {"beyond_schema": True}


def decode(cls: type[T], body: dict[str, Any]) -> T:
    """``cls`` from a JSON object; ``raw`` keeps the object itself."""
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name == "raw":
            values["raw"] = body
        elif f.name in body:
            values[f.name] = _convert(hints[f.name], body[f.name])
    return cls(**values)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _convert(inner, value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if hint is datetime:
        return datetime.fromisoformat(value)
    if hint is date:
        return date.fromisoformat(value)
    if dataclasses.is_dataclass(hint):
        return decode(hint, value)
    return value
