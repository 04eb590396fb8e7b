"""The API's JSON renderer (``controlplane.api.renderers``) writes the bytes DRF's renderer
writes, whatever the data and whichever path (orjson, or DRF's renderer for what orjson does
not encode and for indented output) writes them; only a float may be written in another
notation of the same number."""

import json
import uuid
from collections import OrderedDict
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from hypothesis import given
from hypothesis import strategies as st
from rest_framework import renderers
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

from controlplane.api.renderers import JSONRenderer

KUMO, DRF = JSONRenderer(), renderers.JSONRenderer()

EDGES = {
    "empty": {},
    "unicode": {"name": "計算機クラスタ", "emoji": "🚀", "escape": 'a"b\\c\n\t\x00\x1f'},
    "line separators": {"js": "a\u2028b\u2029c"},
    "utc datetime": {"at": datetime(2026, 11, 25, 14, 0, 1, 123456, tzinfo=UTC)},
    "offset datetime": {"at": datetime(2026, 11, 25, 23, 0, tzinfo=timezone(timedelta(hours=9)))},
    "naive datetime": {"at": datetime(2026, 11, 25, 14, 0)},
    "date and time": {"day": date(2026, 11, 25), "t": time(9, 30, 0, 250000)},
    "timedelta": {"took": timedelta(minutes=3, seconds=2)},
    "decimal": {"price": Decimal("12.3400"), "neg": Decimal("-0.01")},
    "uuid": {"id": uuid.UUID("12345678-1234-5678-1234-567812345678")},
    "lazy string": {"message": gettext_lazy("This field is required.")},
    "numbers": {"i": -(2**63), "j": 2**63 - 1, "f": 0.1, "g": 2.5, "b": True, "n": None},
    "big integer": {"n": 2**64},
    "integer keys": {1: "one", 2: "two"},
    "nested": {"a": [1, [2, {"b": None}], ()], "c": OrderedDict(z=1, a=2)},
    "set": {"s": {3}},
    "drf containers": ReturnDict(
        {"results": ReturnList([{"x": 1}], serializer=None)}, serializer=None
    ),
    "list at the top": [{"id": 1}, {"id": 2}],
}


@pytest.mark.parametrize("data", EDGES.values(), ids=EDGES.keys())
def test_edge_cases_render_as_drf_renders_them(data):
    assert KUMO.render(data) == DRF.render(data)


@pytest.mark.parametrize("media_type", ["application/json; indent=4", "application/json"])
def test_indented_and_plain_output_as_drf(media_type):
    data = {"a": [1, 2], "b": {"c": "ü"}}
    assert KUMO.render(data, media_type, {}) == DRF.render(data, media_type, {})
    assert KUMO.render(data, None, {"indent": 2}) == DRF.render(data, None, {"indent": 2})


def test_nothing_renders_as_nothing():
    assert KUMO.render(None) == DRF.render(None) == b""


def test_what_neither_can_encode_fails_as_drf_fails():
    with pytest.raises(TypeError):
        DRF.render({"x": object()})
    with pytest.raises(TypeError):
        KUMO.render({"x": object()})


def json_like(leaves):
    return st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=5)
            | st.dictionaries(st.text(max_size=8), children, max_size=5)
        ),
        max_leaves=30,
    )


LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text()
    | st.datetimes(timezones=st.sampled_from([None, UTC]))
)
# A decimal is written as DRF's encoder makes it: a float.
NUMBERS = st.floats(allow_nan=False, allow_infinity=False) | st.decimals(
    allow_nan=False, allow_infinity=False
)


@given(json_like(LEAVES))
def test_generated_data_renders_as_drf_renders_it(data):
    assert KUMO.render(data) == DRF.render(data)


@pytest.mark.parametrize(("number", "kumo", "drf"), [(9.999e-05, b"0.00009999", b"9.999e-05")])
def test_a_float_may_be_written_in_another_notation(number, kumo, drf):
    assert (KUMO.render(number), DRF.render(number)) == (kumo, drf)


@given(st.lists(json_like(LEAVES | NUMBERS)))
def test_floats_read_back_as_the_same_numbers(data):
    assert json.loads(KUMO.render(data)) == json.loads(DRF.render(data))
