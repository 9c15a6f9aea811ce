"""ui/plots.py: arrays and token strings in, Plotly figures out, of bounded size."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from ui import plots

LABELS = [f"{i} tok" for i in range(6)]


def test_plots_imports_neither_torch_nor_gradio():
    tree = ast.parse(Path(plots.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"torch", "gradio", "core"}, imported


def test_attention_heatmap_keeps_matrix_labels_and_hover():
    w = np.random.default_rng(0).random((6, 6)).astype(np.float32)
    fig = plots.attention_heatmap(w, LABELS, LABELS, "head 0")
    trace = fig.data[0]
    np.testing.assert_array_equal(np.asarray(trace.z), w)
    assert list(trace.x) == LABELS and list(trace.y) == LABELS
    assert "query %{y} → key %{x}" in trace.hovertemplate and "%{z" in trace.hovertemplate
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 at the top, as matrices are read


def test_attention_heatmap_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="does not match"):
        plots.attention_heatmap(np.zeros((3, 4)), LABELS[:3], LABELS[:3], "x")


def test_model_view_tiles_every_layer_and_head_into_one_trace():
    rng = np.random.default_rng(1)
    overview = rng.random((3, 4, 5, 5)).astype(np.float32)
    fig = plots.model_view(overview, "all heads")
    assert [t.type for t in fig.data] == ["heatmap", "scatter"]  # the mosaic, and one hover marker per tile
    assert len(fig.data[1].x) == 3 * 4 and fig.data[1].text[4 * 2 + 3] == "layer 2, head 3"
    mosaic = np.asarray(fig.data[0].z)
    assert mosaic.dtype == np.uint8
    assert mosaic.shape == (4 * 6 - 1, 3 * 6 - 1)  # heads down, layers across, tiles of 5 with a 1-cell gap
    assert list(fig.layout.xaxis.ticktext) == ["L0", "L1", "L2"]
    assert list(fig.layout.yaxis.ticktext) == ["H0", "H1", "H2", "H3"]
    # tile (layer 2, head 3) is that head scaled to its own peak, on a square-root scale
    tile = mosaic[18:23, 12:17].astype(np.float32) / 255
    np.testing.assert_allclose(tile, np.sqrt(overview[2, 3] / overview[2, 3].max()), atol=1 / 255)
    assert fig.layout.meta == {"layers": 3, "heads": 4, "tile": 5}


def test_model_view_of_a_30_by_9_model_stays_under_2_mb():
    overview = np.random.default_rng(2).random((30, 9, 48, 48)).astype(np.float32)
    assert plots.figure_nbytes(plots.model_view(overview, "smollm2")) < 1_500_000


def test_full_resolution_window_of_256_tokens_stays_small():
    labels = [f"{i} t" for i in range(256)]
    fig = plots.attention_heatmap(np.random.default_rng(3).random((256, 256)), labels, labels, "window")
    assert plots.figure_nbytes(fig) < 600_000


def test_pooled_heatmap_places_blocks_at_token_positions():
    edges = [0, 10, 20, 30]
    fig = plots.pooled_heatmap(np.eye(3), edges, edges, "pooled")
    assert list(fig.data[0].x) == [4.5, 14.5, 24.5]
    with pytest.raises(ValueError, match="edges"):
        plots.pooled_heatmap(np.eye(3), [0, 10], edges, "bad")


def test_stages_figure_draws_three_stages_per_variant_and_sends_masked_cells_as_gaps():
    n = 4
    scores = np.arange(16, dtype=np.float32).reshape(4, 4)
    masked = np.where(np.tril(np.ones((n, n))) > 0, scores, -np.inf)
    probs = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    fig = plots.stages_figure(
        {"on": (scores, masked, probs), "off": (scores, scores, probs)}, LABELS[:4], LABELS[:4], "stages"
    )
    assert len(fig.data) == 6
    masked_sent = np.asarray(fig.data[1].z, dtype=np.float32)
    assert np.isnan(masked_sent[0, 1]) and not np.isinf(masked_sent).any()
    assert "Infinity" not in fig.to_json()


def test_line_and_bar_figures_check_their_series():
    x = np.arange(5)
    fig = plots.line_figure(x, {"a": x * 2.0, "b": x * 3.0}, "t", "k", "dot", reference={"max": 10.0})
    assert [t.name for t in fig.data] == ["a", "b"]
    with pytest.raises(ValueError, match="series 'c'"):
        plots.line_figure(x, {"c": np.arange(3)}, "t", "k", "dot")
    bars = plots.bar_figure(["loss", "accuracy"], {"on": [2.0, 0.4], "off": [0.5, 0.9]}, "mask", "value")
    assert [list(t.y) for t in bars.data] == [[2.0, 0.4], [0.5, 0.9]]


def test_matrix_heatmap_is_symmetric_around_zero_for_signed_data():
    fig = plots.matrix_heatmap(np.array([[-2.0, 1.0], [0.5, 0.0]]), "pe", "dim", "pos")
    assert fig.data[0].zmin == -2.0 and fig.data[0].zmax == 2.0


def test_matrix_heatmap_can_clip_outliers_out_of_the_colour_scale():
    data = np.full((10, 10), 0.1)
    data[0, 0] = 50.0
    fig = plots.matrix_heatmap(data, "learned", "dim", "pos", clip_quantile=0.9)
    assert fig.data[0].zmax == pytest.approx(0.1)
    assert np.asarray(fig.data[0].z).max() == 50.0  # the data itself is untouched


def test_empty_figure_says_why():
    fig = plots.empty_figure("no learned positions")
    assert fig.layout.annotations[0].text == "no learned positions"
