"""A corpus map keeps a readable plot area however few its rows: the shortcuts map (four methods × two sites) was
squashed to about 75 px between its title and its caption; a many-row map grows a row's pixels a row."""

from __future__ import annotations

import numpy as np

from ui.plots.corpus import MAP_MIN_PLOT_PX, MAP_ROW_PX, mean_map


def plot_area(rows: int, cols: int) -> float:
    mean = np.linspace(-1, 1, rows * cols).reshape(rows, cols)
    fig = mean_map(mean, mean - 0.1, mean + 0.1, 8, "method", "site", ["z", "resid_pre"][:cols] if cols == 2 else None,
                   "Denoise: each shortcut's Spearman ρ with exact patching, mean over the pairs", "n = 8 pairs",
                   signed=True, picked=(0, 0), row_labels=[f"m{i}" for i in range(rows)])
    layout = fig.layout
    x_labels = 40                                            # the x axis's tick labels and title, below the plot
    return layout.height - layout.margin.t - layout.margin.b - x_labels


def test_the_shortcuts_map_is_readable():
    area = plot_area(4, 2)
    assert area >= MAP_MIN_PLOT_PX - 1 and area / 4 >= 50      # each of its four rows at least 50 px high


def test_a_map_of_many_rows_gives_each_row_its_pixels():
    assert plot_area(30, 9) >= 30 * MAP_ROW_PX
