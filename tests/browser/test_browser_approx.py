"""The Masks tab's approximate-attention section in a real browser (headless Chromium, Playwright) on the tiny Llama:
top-k on layer 1 draws each head's error maps, read back from plotly's own _fullData: layers across and heads down,
layer 0 not approximated (NaN) and layer 1 holding the service's numbers; the cost button draws the published run,
one line per method of its JSON, the crossover starred, and the live timing in words."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import screenshot, settled  # noqa: E402
from tests.ui.test_approx_service import published  # noqa: E402
from ui.services.approx import approximation_run  # noqa: E402
from ui.services.approx import cost as approx_cost  # noqa: E402

TIMEOUT_MS = 60_000
TEXT = "The lighthouse keeper rowed out to the rocks at dawn. When the storm passed, she lit the lamp again."
TRACES = """(id) => (document.querySelector(`#${id} .js-plotly-plot`)._fullData || []).map((t) => ({
    type: t.type, meta: t.meta ?? null, name: t.name,
    z: t.z ? Array.from(t.z, (row) => Array.from(row, (v) => (Number.isFinite(v) ? v : null))) : null,
    x: t.x ? Array.from(t.x) : null, symbols: t.marker && Array.isArray(t.marker.symbol) ? t.marker.symbol : null}))"""


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


def test_the_section_draws_the_heads_errors_and_the_published_costs(shared_page, tiny_llama_app, tmp_path,
                                                                     monkeypatch):
    _, services, llama = tiny_llama_app
    run = published()
    path = tmp_path / "approx_cost.json"
    path.write_text(json.dumps(run), encoding="utf-8")
    monkeypatch.setattr(approx_cost, "COST_MEASURED", path)     # the app runs in this process
    page = shared_page
    page.get_by_role("tab", name="Masks", exact=True).click()
    page.locator("#approx-text textarea").fill(TEXT)
    page.locator("#approx-k input").fill("3")
    page.locator("#approx-layers textarea, #approx-layers input").first.fill("1")
    page.locator("#approx-run").scroll_into_view_if_needed()
    page.locator("#approx-run").click()
    expect(page.locator("#approx-note")).to_contain_text("tokens of the text read", timeout=TIMEOUT_MS)
    expect(page.locator("#approx-tv .js-plotly-plot .hm image")).to_have_count(1, timeout=TIMEOUT_MS)
    heat = page.evaluate(TRACES, "approx-tv")[0]
    expected = approximation_run(services.models, llama, TEXT, "topk", {"k": 3}, "1").tv     # [layers, heads]
    cfg = services.models.get(llama).config
    z = np.array([[np.nan if v is None else v for v in row] for row in heat["z"]], dtype=np.float64)
    assert heat["type"] == "heatmap" and z.shape == (cfg.n_heads, cfg.n_layers) == expected.T.shape
    assert np.isnan(z[:, 0]).all() and np.isfinite(z[:, 1]).all()          # layer 0 left exact
    np.testing.assert_allclose(z[:, 1], expected[1], rtol=1e-5)
    expect(page.locator("#approx-words")).to_contain_text("with exact attention →", timeout=TIMEOUT_MS)

    page.locator("#approx-cost-run").scroll_into_view_if_needed()
    page.locator("#approx-cost-run").click()
    expect(page.locator("#approx-cost-words")).to_contain_text("Live, this machine, short lengths only",
                                                               timeout=TIMEOUT_MS)
    expect(page.locator("#approx-cost-words")).to_contain_text("What a GPU would change is not measured here")
    expect(page.locator("#approx-cost .js-plotly-plot .scatterlayer .trace")).to_have_count(
        len(run["causal"]) + len(run["bidirectional"]), timeout=TIMEOUT_MS)
    lines = page.evaluate(TRACES, "approx-cost")
    assert [t["meta"] for t in lines] == run["causal"] + run["bidirectional"]
    bigbird = next(t for t in lines if t["meta"] == "bigbird")
    assert bigbird["x"] == [256, 512, 1024] and bigbird["symbols"] == ["circle", "circle", "star"]
    settled(page)
    screenshot(page, "approx-section")
