"""console/heatmaps.py: the cells, labels and legend (test_console.py checks the colours and fit)."""
import io

import numpy as np
import pytest

import console


def record(width=80):
    console.set_lang("en")
    return console.reset_console(width=width, file=io.StringIO())


def test_heatmap_cells_drop_the_leading_zero_and_show_masked_positions_as_dots():
    c = record()
    console.heatmap([[0.5, 0.0], [1.0, 0.25]], ["q0", "q1"], ["k0", "k1"], scale=(0, 1))
    rows = [line.split() for line in c.export_text().splitlines() if line.split()[:1] in (["q0"], ["q1"])]
    assert rows == [["q0", ".50", "·"], ["q1", "1.00", ".25"]]


def test_heatmap_digits_and_negative_values():
    c = record()
    console.heatmap([[-1.25, 2.5]], ["r"], ["a", "b"], digits=1)
    text = c.export_text()
    row = next(line for line in text.splitlines() if line.split()[:1] == ["r"])
    assert row.split() == ["r", "-1.2", "2.5"]
    assert "scale, this map's -1.2–2.5:" in text


def test_heatmap_truncates_long_labels_with_an_ellipsis():
    c = record()
    console.heatmap(np.eye(2) * 0.5, ["a_very_long_label", "b"], ["columnlabel", "c"], scale=(0, 1),
                    label_width=6)
    text = c.export_text()
    assert "a_ver…" in text and "a_very" not in text and "colum…" in text


def test_heatmap_says_when_one_column_was_left_out():
    c = record(width=40)
    labels = [f"t{i}" for i in range(8)]
    console.heatmap(np.ones((2, 8)) / 8, ["a", "b"], labels, scale=(0, 1))
    assert "column t7 hidden: terminal 40 wide" in c.export_text()


def test_heatmap_rejects_a_matrix_that_is_not_2d():
    with pytest.raises(ValueError, match="2-D"):
        console.heatmap(np.ones(3), ["a", "b", "c"], ["x"])


def test_heatmap_of_only_infinite_values_still_has_a_scale():
    c = record()
    console.heatmap([[-np.inf, np.inf]], ["r"], ["a", "b"])
    assert "scale, this map's 0–1:" in c.export_text()
