"""The Heads tab's views keep a session's results in a HeadsCache they never change in place: the atlas of the
default text may be handed to every session, so what one session adds (a lens, a sweep) must not reach another.
And the figures' words: heads named "L3 H2", the score map's axes labelled tile by tile."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from tiny_app_model import build_tiny_llama
from ui.plots.heads import head_score_map, tick_step, wrapped_title
from ui.services import Services
from ui.services.models import ModelStore
from ui.views import heads as views

TEXT = "The keeper lit the lamp. The keeper lit the lamp again at dawn."


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = str(build_tiny_llama(tmp_path_factory.mktemp("heads-views") / "tiny-llama", max_positions=64))
    store = ModelStore()
    return Services.create(models=store), folder


def test_a_shared_atlas_cache_is_never_changed_by_a_later_section(setup):
    services, folder = setup
    *_, shared = views.atlas_view(services, folder, TEXT, "previous_token", 0, 0)
    assert shared.scores is not None and shared.lens is None and shared.surprisal is None and not shared.sweeps
    _, _, after_lens = views.lens_view(services, folder, TEXT, previous=shared)
    _, _, after_surprisal = views.surprisal_view(services, folder, TEXT, previous=shared)
    *_, after_sweep = list(views.sweep_view(services, folder, TEXT, "zero", "local", previous=shared))[-1]
    *_, after_atlas = views.atlas_view(services, folder, TEXT, "local", 1, 2, previous=shared)
    # each call kept what it computed in a new cache, built on the shared one's results
    assert after_lens.lens is not None and after_surprisal.surprisal is not None and "zero" in after_sweep.sweeps
    assert after_lens.scores is shared.scores and after_atlas.scores is shared.scores
    # and the shared one is as the atlas left it
    assert shared.lens is None and shared.surprisal is None and not shared.sweeps
    assert all(cache is not shared for cache in (after_lens, after_surprisal, after_sweep, after_atlas))


def test_the_atlas_says_kept_when_a_session_asks_again(setup):
    services, folder = setup
    *_, cache = views.atlas_view(services, folder, TEXT, "previous_token", 0, 0)
    note, *_ = views.atlas_view(services, folder, TEXT, "induction", 0, 0, previous=cache)
    assert "kept from the last run" in note


def test_named_heads_read_as_layer_and_head_not_as_decimals(setup):
    services, folder = setup
    text = views.thresholds_markdown(services.models.get(folder), {"previous_token": [(1, 3, 0.62)]})
    assert "L1 H3 (0.62)" in text and "1.3" not in text


def test_the_score_map_labels_every_layer_up_to_32_and_every_head():
    fig = head_score_map(np.random.default_rng(0).random((30, 9)), "previous-token: " + "a long description " * 4,
                         "previous-token", zmax=1.0)
    assert (fig.layout.xaxis.tickmode, fig.layout.xaxis.dtick) == ("linear", 1)
    assert (fig.layout.yaxis.tickmode, fig.layout.yaxis.dtick) == ("linear", 1)
    assert "<b>L%{x} H%{y}</b>" in fig.data[0].hovertemplate
    # the title is wrapped, not clipped, and the top margin holds every line
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) > 1 and max(map(len, lines)) <= 46 and fig.layout.margin.t >= 18 * len(lines)
    assert tick_step(32, 32) == 1 and tick_step(33, 32) == 2 and tick_step(80, 32) == 4
    assert wrapped_title("a<br>b") == ("a<br>b", 2)


def subplot_titles(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_the_sweep_measures_the_induction_score_and_the_loss_on_the_same_probe(setup):
    from core.analysis import heads as core_heads
    from ui.services.heads import INDUCTION_LENGTH, INDUCTION_SEED

    services, folder = setup
    model = services.models.get(folder)
    *_, cache = views.atlas_view(services, folder, TEXT, "previous_token", 0, 0)
    note, fig, swept = list(views.sweep_view(services, folder, TEXT, "zero", "induction", previous=cache))[-1]
    # computed here from the core alone: the probe, every head ablated on it, the rank correlation
    probe = core_heads.induction(model, INDUCTION_LENGTH, INDUCTION_SEED)
    increase = core_heads.ablation_sweep(model, probe.ids, "zero")
    rho = spearmanr(increase.flatten(), probe.scores.flatten()).statistic
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float).T, increase.numpy(), atol=1e-4)  # drawn [H, L]
    np.testing.assert_allclose(np.asarray(fig.data[1].z, dtype=float).T, probe.scores.numpy(), atol=1e-4)
    assert f"ρ = {rho:+.2f}" in note and f"ρ = {rho:+.2f}" in fig.layout.title.text
    # and the figure says where both were measured
    assert all("on the probe" in title for title in subplot_titles(fig)), subplot_titles(fig)
    assert "induction probe" in fig.layout.title.text.replace("<br>", " ")
    # the probe's sweep belongs to the model, not the text: a new text keeps it, and the text's own sweep is apart
    assert "zero" in swept.probe_sweeps and not swept.sweeps
    again, *_ = list(views.sweep_view(services, folder, TEXT + " More.", "zero", "induction", previous=swept))[-1]
    assert "kept from the last run" in again


def test_the_sweep_of_a_text_score_says_it_is_measured_on_the_text(setup):
    services, folder = setup
    note, fig, swept = list(views.sweep_view(services, folder, TEXT, "zero", "previous_token"))[-1]
    titles = subplot_titles(fig)
    assert all("on your text" in title for title in titles), titles
    assert "probe" not in " ".join(titles) + fig.layout.title.text and "zero" in swept.sweeps
