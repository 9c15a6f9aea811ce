"""The Masks tab's figures: one figure per stage of eq. 2.1 with its colour bar in its own margin, short titles
that fit a third of a wide page or a phone, and a bar of exactly 0 that is still seen (a dot on the baseline)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiny_app_model import build_tiny_llama
from ui.plots.attention import STAGE_TITLES, STAGES, score_bound, stage_figure, stages_figure
from ui.plots.charts import bar_figure, line_figure

N = 4
LABELS = [f"{i} tok" for i in range(N)]
# what a title (14 px) and a subtitle (11–12 px) hold in a figure about 260 px wide: a third of a wide page's
# figure column, or a phone's width less its margins
TITLE_CHARS, SUBTITLE_CHARS = 32, 48


def window():
    scores = np.arange(N * N, dtype=np.float32).reshape(N, N) - 6
    allowed = np.tril(np.ones((N, N))) > 0
    masked = np.where(allowed, scores, -np.inf)
    probs = allowed / allowed.sum(1, keepdims=True)
    return scores, masked, probs


def visible_text(html: str) -> str:
    """What plotly draws of a title: its tags (<b>, <br>) removed."""
    import re

    return re.sub(r"<[^>]+>", "", html)


def test_each_stage_is_one_heatmap_with_a_short_title_and_its_own_colour_bar():
    scores, masked, probs = window()
    for stage, matrix in zip(STAGES, (scores, masked, probs)):
        fig = stage_figure(matrix, stage, LABELS, LABELS, "<b>causal mask on</b> · L0 H0 · tokens 0–3")
        (trace,) = fig.data
        assert trace.type == "heatmap" and trace.showscale
        assert fig.layout.title.text == STAGE_TITLES[stage] and len(STAGE_TITLES[stage]) <= TITLE_CHARS
        assert len(visible_text(fig.layout.title.subtitle.text)) <= SUBTITLE_CHARS
        # the colour bar stands right of the plot area (paper x ≥ 1, plotly's default 1.02), never over it
        assert trace.colorbar.x is None or trace.colorbar.x >= 1.0
        assert list(trace.x) == LABELS and list(trace.y) == LABELS


def test_a_masked_stage_sends_minus_infinity_as_gaps_and_scores_share_a_signed_scale():
    scores, masked, probs = window()
    bound = score_bound([scores, scores * 2])
    assert bound == pytest.approx(2 * 9)
    fig = stage_figure(masked, "masked", LABELS, LABELS, "on", bound=bound)
    sent = np.asarray(fig.data[0].z, dtype=np.float32)
    assert np.isnan(sent[0, 1]) and not np.isinf(sent).any() and "Infinity" not in fig.to_json()
    assert (fig.data[0].zmin, fig.data[0].zmax, fig.data[0].zmid) == (-bound, bound, 0.0)
    weights = stage_figure(probs, "softmax", LABELS, LABELS, "on").data[0]
    assert (weights.zmin, weights.zmax) == (0.0, 1.0)


def test_a_stage_figure_refuses_a_stage_or_labels_it_does_not_know():
    scores, _, _ = window()
    with pytest.raises(ValueError, match="stage must be one of scores, masked, softmax"):
        stage_figure(scores, "logits", LABELS, LABELS, "x")
    with pytest.raises(ValueError, match="does not match"):
        stage_figure(scores, "scores", LABELS[:3], LABELS, "x")


def test_token_markup_in_stage_labels_is_drawn_as_text():
    scores, _, _ = window()
    labels = ["0 <b>", "1 &", "2 a", "3 b"]
    trace = stage_figure(scores, "scores", labels, labels, "x").data[0]
    assert list(trace.x)[:2] == ["0 &lt;b&gt;", "1 &amp;"]


def test_the_one_figure_of_stages_keeps_its_colour_bars_clear_of_the_panels():
    """stages_figure (the Inside tab's stage 5): short subplot titles, the variant named on its row, both colour
    bars at the right edge."""
    scores, masked, probs = window()
    fig = stages_figure({"on": (scores, masked, probs), "off": (scores, scores, probs)}, LABELS, LABELS, "stages")
    assert len(fig.data) == 6
    assert [a.text for a in fig.layout.annotations] == [STAGE_TITLES[s] for s in STAGES] * 2
    bars = [t.colorbar for t in fig.data if t.showscale]
    assert len(bars) == 2 and all(bar.x >= 1.0 for bar in bars)
    assert fig.layout.yaxis.title.text == "on" and fig.layout.yaxis4.title.text == "off"


def test_a_zero_bar_is_marked_on_the_baseline_and_labelled_as_zero():
    fig = bar_figure(["0", "1", "2"], {"padding mask on": [0.0, 0.0, 0.0], "padding mask off": [0.8, 0.0, 0.5]},
                     "Weight on pad tokens", "weight", mark_zeros=True)
    bars = [t for t in fig.data if t.type == "bar"]
    dots = {t.offsetgroup: t for t in fig.data if t.type == "scatter"}
    assert [list(b.y) for b in bars] == [[0.0, 0.0, 0.0], [0.8, 0.0, 0.5]]  # the values stay what they are
    on, off = dots["padding mask on"], dots["padding mask off"]
    assert list(on.y) == [0.0, 0.0, 0.0] and list(off.y) == [None, 0.0, None]
    assert list(on.text) == ["0.000"] * 3 and "exactly 0" in on.hovertemplate and on.mode == "markers"
    assert on.marker.color == bars[0].marker.color and off.marker.color == bars[1].marker.color
    assert all(b.offsetgroup == b.name for b in bars) and fig.layout.scattermode == "group"  # a dot under its bar
    assert on.showlegend and on.name == "padding mask on: exactly 0"
    assert "0.000" in fig.to_json()


def test_bar_and_line_figures_are_unchanged_without_the_new_options():
    bars = bar_figure(["a", "b"], {"x": [0.0, 1.0]}, "t", "v")
    assert [t.type for t in bars.data] == ["bar"] and bars.layout.scattermode is None
    assert bars.layout.title.subtitle.text is None
    lines = line_figure(np.arange(3), {"x": np.ones(3)}, "t", "k", "v")
    assert lines.layout.title.subtitle.text is None and lines.layout.margin.t == 60


def test_a_subtitle_goes_under_the_title_with_room_for_both():
    fig = line_figure(np.arange(3), {"x": np.ones(3)}, "Mean attention entropy per layer", "layer", "nats",
                      subtitle="lower: sharper rows")
    assert fig.layout.title.subtitle.text == "lower: sharper rows" and fig.layout.margin.t >= 80


@pytest.fixture(scope="module")
def tiny_services(tmp_path_factory):
    from ui.services import Services
    from ui.services.models import ModelStore

    folder = str(build_tiny_llama(tmp_path_factory.mktemp("mask-views") / "tiny-llama", max_positions=64))
    return Services.create(models=ModelStore()), folder


def test_the_mask_view_gives_six_stage_figures_and_titles_that_fit(tiny_services):
    from ui.views.export import image_name
    from ui.views.masks import mask_view

    services, folder = tiny_services
    out = mask_view(services, folder, "The keeper lit the lamp at dawn and again at dusk.", 1, 2, 1, 6,
                    "A longer sentence than the other one.", "Short.")
    note, *stages, causal, causal_note, padding, padding_note, entropy, entropy_note = out
    assert len(stages) == 6 and isinstance(causal_note, str) and "padded" in padding_note
    assert [fig.layout.title.text for fig in stages] == [STAGE_TITLES[s] for s in STAGES] * 2
    assert [image_name(fig).split("_")[-1] for fig in stages] == [
        f"stage-{mask}-{stage}" for mask in ("on", "off") for stage in STAGES]
    assert "causal mask on" in stages[0].layout.title.subtitle.text
    assert "causal mask off" in stages[5].layout.title.subtitle.text and "L1 H2" in stages[5].layout.title.subtitle.text
    masked_on = np.asarray(stages[1].data[0].z, dtype=np.float64)
    assert masked_on.shape == (6, 6) and np.isnan(masked_on[np.triu_indices(6, 1)]).all()
    for fig in (*stages, causal, padding, entropy):
        assert len(visible_text(fig.layout.title.text)) <= TITLE_CHARS, fig.layout.title.text
        assert len(visible_text(fig.layout.title.subtitle.text or "")) <= SUBTITLE_CHARS, fig.layout.title.subtitle
    # the padding mask's bars are exactly 0, and each is marked where it stands
    dots = [t for t in padding.data if t.type == "scatter" and t.showlegend]
    assert [t.name for t in dots] == ["padding mask on: exactly 0"] and set(dots[0].y) == {0.0}
    assert json.loads(padding.to_json())["data"][1]["text"][0] == "0.000"
