"""How good are the shortcuts, as services and a plot on tiny random models: the tab's pair gives the core's exact
sweep and each method's own map on the compared cells, each cell named; ρ is Spearman's (scipy as the reference)
on what is drawn; the flow graph is offered for heads only; every pair the tab refuses (an encoder, a prompt over
the limit, equal prompts, different token counts) is refused in words by the same check as the sweep; the
scatter's titles, hovers and diagonal come from the arrays it is given."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from core import load_model
from core.analysis import patching, shortcuts
from tiny_app_model import build_tiny_bert, build_tiny_llama, plotly_array
from ui.plots.patching import shortcut_scatter
from ui.services.checks import UserError
from ui.services.patching import (MAX_PATCH_TOKENS, SITE_METHODS, MethodAgreement, TokenMismatch, cell_names,
                                  one_estimate, pair_shortcuts, prepare_pair)
from ui.services.text import token_texts

CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("shortcut-models")
    return (load_model(build_tiny_llama(root / "tiny-llama", max_positions=128)),
            load_model(build_tiny_bert(root / "tiny-bert")))


@pytest.fixture(scope="module")
def pair(models):
    return prepare_pair(models[0], CLEAN, CORRUPTED, "", "")


@pytest.mark.parametrize("site", ["z", "resid_pre"])
def test_the_pairs_comparison_is_the_cores_exact_sweep_and_each_methods_map(models, pair, site):
    model = models[0]
    clean, corrupted = pair.ids
    result = pair_shortcuts(model, pair, site, "denoise")
    truth = patching.patch_sweep(model, clean, corrupted, pair.answer, pair.foil, site, "denoise")
    cells = shortcuts.changed_cells(model, clean, corrupted, site).flatten()
    assert len(result.names) == int(cells.sum()) and result.cells == truth.scores.numel()
    np.testing.assert_allclose(result.exact, truth.scores.flatten()[cells].numpy(), atol=1e-5)
    assert [row.method for row in result.methods] == list(SITE_METHODS[site])
    for row in result.methods:
        estimate = shortcuts.approximate_sweep(model, clean, corrupted, pair.answer, pair.foil, site, "denoise",
                                               row.method)
        np.testing.assert_allclose(row.estimates, estimate.scores.flatten()[cells].numpy(), atol=1e-5)
        if row.signed and np.ptp(row.estimates) > 0:
            assert row.rho == pytest.approx(spearmanr(result.exact, row.estimates).statistic, abs=1e-9)
        assert row.cost > 0 and 0 <= row.overlap <= 1
        assert set(row.false_negatives) <= set(result.names)
    names = cell_names(site, tuple(truth.scores.shape), token_texts(model, pair.clean.ids))
    assert result.names == [n for n, keep in zip(names, cells.tolist()) if keep]


def test_cells_are_named_as_the_page_names_them():
    assert cell_names("z", (2, 3), [])[:4] == ["L0 H0", "L0 H1", "L0 H2", "L1 H0"]
    assert cell_names("resid_pre", (2, 2), ["When", " Mary"]) == ["L0 pos 0 'When'", "L0 pos 1 ' Mary'",
                                                                   "L1 pos 0 'When'", "L1 pos 1 ' Mary'"]


def test_one_methods_map_is_the_cores_and_flow_is_for_heads_only(models, pair):
    model = models[0]
    clean, corrupted = pair.ids
    sweep = one_estimate(model, pair, "resid_pre", "noise", "ig")
    expected = shortcuts.approximate_sweep(model, clean, corrupted, pair.answer, pair.foil, "resid_pre", "noise", "ig")
    torch.testing.assert_close(sweep.scores, expected.scores)
    assert "flow" not in SITE_METHODS["resid_pre"]
    with pytest.raises(UserError, match="Method"):
        one_estimate(model, pair, "resid_pre", "denoise", "flow")
    with pytest.raises(UserError, match="Site"):
        pair_shortcuts(model, pair, "attn_in", "denoise")
    with pytest.raises(UserError, match="Mode"):
        pair_shortcuts(model, pair, "z", "sideways")


def test_a_pair_the_tab_cannot_measure_is_refused_in_words(models, pair):
    llama, bert = models
    with pytest.raises(UserError, match="decoder"):
        prepare_pair(bert, CLEAN, CORRUPTED, "", "")
    long = "the bread is warm " * MAX_PATCH_TOKENS
    with pytest.raises(UserError, match=f"at most {MAX_PATCH_TOKENS} tokens"):
        prepare_pair(llama, long, long, "", "")
    with pytest.raises(TokenMismatch):
        prepare_pair(llama, CLEAN, "the bread", "", "")
    same = dataclasses.replace(pair, corrupted=pair.clean)      # the answer and foil kept apart
    with pytest.raises(UserError, match="same"):
        pair_shortcuts(llama, same, "z", "denoise")
    with pytest.raises(UserError, match="same"):
        one_estimate(llama, same, "z", "denoise", "atp")


def test_the_scatter_draws_each_method_against_exact_with_its_numbers_in_the_title():
    exact = np.array([1.0, 0.5, 0.0, -0.2], dtype=np.float32)
    atp = np.array([0.8, 0.4, 0.1, -0.1], dtype=np.float32)
    flow = np.array([0.1, 0.9, 0.0, 0.3], dtype=np.float32)
    names = ["L0 H0", "L0 H1", "L1 pos 2 '<b>'", "L1 H1"]
    fig = shortcut_scatter(exact, [atp, flow], ["atp", "flow"], [0.95, 0.1], [1.0, 0.5], [2.25, 3.5],
                           [True, False], names, 2, 17.4, "Denoising z")
    data = json.loads(fig.to_json())
    points = [t for t in data["data"] if t["mode"] == "markers"]
    assert [t["name"] for t in points] == ["atp", "flow"]
    assert points[0]["customdata"][2] == "L1 pos 2 '&lt;b&gt;'"        # a token's text is escaped
    np.testing.assert_allclose(plotly_array(points[1]["y"]), flow, rtol=1e-6)
    lines = [t for t in data["data"] if t["mode"] == "lines"]
    assert len(lines) == 1 and lines[0]["xaxis"] == "x"                  # the diagonal for the signed method only
    titles = [a["text"] for a in data["layout"]["annotations"] if a.get("name") != "title"]
    assert "ρ 0.95" in titles[0] and "top-2 overlap 1.00" in titles[0] and "cost 2.2 passes" in titles[0]
    assert "vs |exact|" in titles[1] and "cost 3.5 passes" in titles[1]
    # the title wrapped above the plot (fit_narrow), so a phone's width holds it
    title = next(a["text"] for a in data["layout"]["annotations"] if a.get("name") == "title")
    assert "exact sweep: 17.4 passes" in title.replace("<br>", " ")
    with pytest.raises(ValueError, match="one value per compared cell"):
        shortcut_scatter(exact, [atp[:3]], ["atp"], [1.0], [1.0], [1.0], [True], names, 2, 1.0, "t")


def test_a_methods_line_keeps_its_star_and_says_when_rho_is_undefined():
    from ui.views.patching import method_line
    row = MethodAgreement("atp*", np.zeros(3), 0.5, 1.0, ["L1 pos 2 '_x*'"], 0.02, 3.0, True)
    line = method_line(row, 2)
    assert line.startswith("- **atp\\***") and "L1 pos 2 '\\_x\\*'" in line and "ρ 0.50" in line
    flow = MethodAgreement("flow", np.zeros(3), float("nan"), 0.0, [], float("nan"), 1.0, False)
    line = method_line(flow, 2)
    assert "ρ against |exact| — (one of the maps is constant)" in line and "signed error" not in line
