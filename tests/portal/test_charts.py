"""The server-side SVG bar chart."""

import re
from decimal import Decimal

import pytest

from controlplane.portal import charts


@pytest.mark.parametrize(
    ("value", "top"),
    [(0, 1.0), (0.0036, 0.005), (1, 1), (1.2, 2), (2.2, 2.5), (7, 10), (745.5, 1000)],
)
def test_the_axis_top_is_a_round_number_at_or_above_the_highest_bar(value, top):
    assert charts._nice_ceiling(value) == pytest.approx(top)


def test_bars_scale_to_the_axis_and_escape_their_labels():
    svg = charts.bars([("<b>", Decimal("1")), ("2", Decimal("2"))], unit="GPU-h", title='a "t"')
    assert svg.startswith("<svg") and 'aria-label="a &quot;t&quot;"' in svg
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    heights = [float(h) for h in re.findall(r'height="([\d.]+)" class="bar"', svg)]
    assert heights[1] == pytest.approx(2 * heights[0])
    assert ">2 GPU-h<" in svg
