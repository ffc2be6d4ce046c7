"""console/colour.py: the xterm palette, WCAG luminance and contrast, and the per-system ramps."""
import re

import pytest

from console import colour, contrast_ratio, cube_rgb, heat_style, relative_luminance


def test_cube_rgb_matches_the_xterm_256_colour_cube_and_grey_ramp():
    assert cube_rgb(16) == (0, 0, 0) and cube_rgb(231) == (255, 255, 255)
    assert cube_rgb(196) == (255, 0, 0) and cube_rgb(21) == (0, 0, 255) and cube_rgb(53) == (95, 0, 95)
    assert cube_rgb(232) == (8, 8, 8) and cube_rgb(255) == (238, 238, 238)


def test_relative_luminance_and_contrast_follow_wcag():
    assert relative_luminance((0, 0, 0)) == 0 and relative_luminance((255, 255, 255)) == pytest.approx(1)
    assert relative_luminance((0, 255, 0)) == pytest.approx(0.7152)
    assert contrast_ratio((0, 0, 0), (255, 255, 255)) == pytest.approx(21)
    assert contrast_ratio((255, 255, 255), (0, 0, 0)) == contrast_ratio((0, 0, 0), (255, 255, 255))
    assert contrast_ratio((118, 118, 118), (255, 255, 255)) == pytest.approx(4.54, abs=0.01)


@pytest.mark.parametrize("system, pattern", [
    ("truecolor", r"rgb\((0,0,0|255,255,255)\) on rgb\(\d+,\d+,\d+\)"),
    (None, r"rgb\((0,0,0|255,255,255)\) on rgb\(\d+,\d+,\d+\)"),
    ("256", r"color\((16|231)\) on color\(\d+\)"),
    ("standard", r"color\((0|15)\) on color\((0|4|6|14|15)\)"),
])
def test_heat_style_speaks_each_colour_systems_own_codes(system, pattern):
    for k in range(21):
        assert re.fullmatch(pattern, heat_style(k / 20, system)), (system, k)


def test_heat_style_ends_are_the_ramps_ends_and_windows_is_standard():
    assert heat_style(0, "truecolor").endswith("on rgb(68,1,84)")
    assert heat_style(1, "truecolor") == "rgb(0,0,0) on rgb(253,231,37)"
    assert heat_style(0, "256").endswith(f"color({colour._RAMP_256[0]})")
    assert heat_style(1, "256").endswith(f"color({colour._RAMP_256[-1]})")
    assert all(heat_style(k / 10, "windows") == heat_style(k / 10, "standard") for k in range(11))
