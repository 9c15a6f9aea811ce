"""ui/plots: arrays and token strings in, Plotly figures out, of bounded size."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from ui.plots.attention import attention_heatmap, model_view, pooled_heatmap, stages_figure
from ui.plots.base import empty_figure, figure_nbytes
from ui.plots.charts import bar_figure, line_figure, matrix_heatmap
from ui.plots.heads import attribution_figure, head_score_map, lens_figure, loss_change_figure, paired_head_maps
from ui.plots.text import surprisal_html

LABELS = [f"{i} tok" for i in range(6)]


def test_plots_import_neither_torch_nor_gradio():
    for path in sorted((Path(__file__).resolve().parents[2] / "ui" / "plots").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"torch", "gradio", "core"}, (path.name, imported)


def test_attention_heatmap_keeps_matrix_labels_and_hover():
    w = np.random.default_rng(0).random((6, 6)).astype(np.float32)
    fig = attention_heatmap(w, LABELS, LABELS, "head 0")
    trace = fig.data[0]
    np.testing.assert_array_equal(np.asarray(trace.z), w)
    assert list(trace.x) == LABELS and list(trace.y) == LABELS
    assert "query %{y} → key %{x}" in trace.hovertemplate and "%{z" in trace.hovertemplate
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 at the top, as matrices are read


def test_attention_heatmap_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="does not match"):
        attention_heatmap(np.zeros((3, 4)), LABELS[:3], LABELS[:3], "x")


def test_model_view_tiles_every_layer_and_head_into_one_trace():
    rng = np.random.default_rng(1)
    overview = rng.random((3, 4, 5, 5)).astype(np.float32)
    fig = model_view(overview, "all heads")
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
    assert figure_nbytes(model_view(overview, "smollm2")) < 1_500_000


def test_full_resolution_window_of_256_tokens_stays_small():
    labels = [f"{i} t" for i in range(256)]
    fig = attention_heatmap(np.random.default_rng(3).random((256, 256)), labels, labels, "window")
    assert figure_nbytes(fig) < 600_000


def test_pooled_heatmap_places_blocks_at_token_positions():
    edges = [0, 10, 20, 30]
    fig = pooled_heatmap(np.eye(3), edges, edges, "pooled")
    assert list(fig.data[0].x) == [4.5, 14.5, 24.5]
    with pytest.raises(ValueError, match="edges"):
        pooled_heatmap(np.eye(3), [0, 10], edges, "bad")


def test_stages_figure_draws_three_stages_per_variant_and_sends_masked_cells_as_gaps():
    n = 4
    scores = np.arange(16, dtype=np.float32).reshape(4, 4)
    masked = np.where(np.tril(np.ones((n, n))) > 0, scores, -np.inf)
    probs = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    fig = stages_figure(
        {"on": (scores, masked, probs), "off": (scores, scores, probs)}, LABELS[:4], LABELS[:4], "stages"
    )
    assert len(fig.data) == 6
    masked_sent = np.asarray(fig.data[1].z, dtype=np.float32)
    assert np.isnan(masked_sent[0, 1]) and not np.isinf(masked_sent).any()
    assert "Infinity" not in fig.to_json()


def test_line_and_bar_figures_check_their_series():
    x = np.arange(5)
    fig = line_figure(x, {"a": x * 2.0, "b": x * 3.0}, "t", "k", "dot", reference={"max": 10.0})
    assert [t.name for t in fig.data] == ["a", "b"]
    with pytest.raises(ValueError, match="series 'c'"):
        line_figure(x, {"c": np.arange(3)}, "t", "k", "dot")
    bars = bar_figure(["loss", "accuracy"], {"on": [2.0, 0.4], "off": [0.5, 0.9]}, "mask", "value")
    assert [list(t.y) for t in bars.data] == [[2.0, 0.4], [0.5, 0.9]]


def test_matrix_heatmap_is_symmetric_around_zero_for_signed_data():
    fig = matrix_heatmap(np.array([[-2.0, 1.0], [0.5, 0.0]]), "pe", "dim", "pos")
    assert fig.data[0].zmin == -2.0 and fig.data[0].zmax == 2.0


def test_matrix_heatmap_can_clip_outliers_out_of_the_colour_scale():
    data = np.full((10, 10), 0.1)
    data[0, 0] = 50.0
    fig = matrix_heatmap(data, "learned", "dim", "pos", clip_quantile=0.9)
    assert fig.data[0].zmax == pytest.approx(0.1)
    assert np.asarray(fig.data[0].z).max() == 50.0  # the data itself is untouched


def test_empty_figure_says_why():
    fig = empty_figure("no learned positions")
    assert fig.layout.annotations[0].text == "no learned positions"


def test_head_score_map_puts_layers_across_and_names_each_tile_on_hover():
    scores = np.arange(12, dtype=np.float32).reshape(3, 4) / 12  # [layers, heads]
    fig = head_score_map(scores, "previous-token", "score", zmax=1.0, marked=[(2, 1)])
    heat, ring = fig.data
    np.testing.assert_array_equal(np.asarray(heat.z), scores.T)  # heads down, layers across
    assert list(heat.x) == [0, 1, 2] and list(heat.y) == [0, 1, 2, 3]  # a click reads back layer and head
    assert "layer %{x}, head %{y}" in heat.hovertemplate and "score %{z" in heat.hovertemplate
    assert heat.zmin == 0 and heat.zmax == 1.0
    assert (list(ring.x), list(ring.y)) == ([2], [1])
    assert fig.layout.xaxis.range == (-0.5, 2.5) and fig.layout.yaxis.range == (3.5, -0.5)  # head 0 on top
    with pytest.raises(ValueError, match="layers, heads"):
        head_score_map(np.zeros(4), "x", "score")


def test_paired_head_maps_draw_a_signed_map_beside_a_score_map():
    increase = np.array([[0.5, -0.1], [0.0, 0.2], [-0.3, 0.1]])
    score = np.array([[0.9, 0.1], [0.2, 0.3], [0.0, 0.4]])
    fig = paired_head_maps(increase, score, ("loss", "score"), ("Δ loss", "score"), "sweep")
    left, right = fig.data
    assert np.asarray(left.z).shape == np.asarray(right.z).shape == (2, 3)
    assert (left.zmin, left.zmax, left.zmid) == (-0.5, 0.5, 0.0)  # symmetric around no change
    assert right.zmin == 0 and right.xaxis == "x2"
    with pytest.raises(ValueError, match="one shape"):
        paired_head_maps(increase, score[:2], ("a", "b"), ("a", "b"), "x")


def test_loss_change_bars_are_ablated_minus_clean_with_both_on_hover():
    clean, ablated = np.array([1.0, 2.0, 3.0]), np.array([1.5, 1.0, 3.0])
    fig = loss_change_figure(LABELS[1:4], clean, ablated, "ablation")
    bars = fig.data[0]
    np.testing.assert_allclose(np.asarray(bars.y), [0.5, -1.0, 0.0])
    np.testing.assert_allclose(np.asarray(bars.customdata), np.stack([clean, ablated], -1))
    assert "clean %{customdata[0]" in bars.hovertemplate and list(bars.x) == LABELS[1:4]
    with pytest.raises(ValueError, match="labels"):
        loss_change_figure(LABELS[:2], clean, ablated, "x")


def test_attribution_figure_scales_each_view_to_its_peak_and_keeps_raw_values_on_hover():
    views = {"head": np.array([0.1, 0.7, 0.2]), "gradient × input": np.array([2.0, -4.0, 1.0])}
    fig = attribution_figure(LABELS[:3], views, "why")
    head, grad = fig.data
    np.testing.assert_allclose(np.asarray(head.y), [1 / 7, 1.0, 2 / 7], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad.y), [0.5, -1.0, 0.25])  # signs kept
    np.testing.assert_allclose(np.asarray(grad.customdata), views["gradient × input"])
    with pytest.raises(ValueError, match="series 'head'"):
        attribution_figure(LABELS[:2], views, "why")


def test_lens_figure_colours_by_the_final_answer_and_hovers_each_layers_top_token():
    final = np.array([[0.1, 0.2, 0.0], [0.9, 0.8, 0.5]], dtype=np.float32)
    top_prob = np.array([[0.3, 0.4, 0.5], [0.9, 0.8, 0.5]], dtype=np.float32)
    tokens = [["a", "b", "c"], ["d", "e", "f"]]
    fig = lens_figure(final, tokens, top_prob, LABELS[:3], [1, 1, 0], "lens")
    heat, settle = fig.data
    np.testing.assert_array_equal(np.asarray(heat.z), final)
    assert heat.customdata[1][0] == "d (0.90)" and "top token here: %{customdata}" in heat.hovertemplate
    assert heat.texttemplate == "%{text}"  # few cells: the tokens are printed in them
    assert list(settle.y) == [1, 1, 0] and list(settle.x) == LABELS[:3]
    with pytest.raises(ValueError, match="settle"):
        lens_figure(final, tokens, top_prob, LABELS[:3], [1], "lens")


def test_surprisal_html_shades_every_predicted_token_and_escapes_everything():
    pieces = ["<b>", " fish & chips", '"quote"']
    page = surprisal_html(pieces, np.array([2.5, 20.0]), [[("<i>", 0.5), (" x", 0.1)], [("'", 0.2)]])
    assert "<b>" not in page and "&lt;b&gt;" in page and "fish &amp; chips" in page
    assert "&lt;i&gt;" in page and "&quot;quote&quot;" in page
    assert page.count('data-loss="') == 2 and 'data-loss="2.5000"' in page
    assert "rgba(220, 60, 40, 0.850)" in page  # 20 nats: past the full shade
    with pytest.raises(ValueError, match="3 tokens need 2 losses"):
        surprisal_html(pieces, np.array([1.0]), [[]])
