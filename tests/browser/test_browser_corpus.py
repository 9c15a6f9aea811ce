"""The Across texts tab in headless Chromium on a tiny random model, at 1400 px and on a 390 px phone: head scores
over the built-in induction texts draw the mean map and the strip of one cell inside the page's width, each with
its line on n and the interval; hovering a cell gives its mean, interval and n, and a click on it (or the cell
typed) redraws the strip for that cell; one head's query/key plane is drawn with its line."""

from __future__ import annotations

import os
import re

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import screenshot, settled  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402
from ui.services.corpus.over import INDUCTION_LENGTH  # noqa: E402

RUN_TIMEOUT_MS = 60_000
VIEWPORTS = {"wide": {"width": 1400, "height": 1000}, "phone": {"width": 390, "height": 844}}
LINE = "95 % CI of the mean over n = 8 texts, percentile bootstrap"


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus-browser")
    llama = str(build_tiny_llama(root / "tiny-llama"))
    patch = pytest.MonkeyPatch()
    patch.setenv("ATTN_RUNS_DIR", str(root / "runs"))    # saved corpus jobs go here, not into the working tree
    demo, url, _ = launch_app([llama], llama)
    yield url
    demo.close()
    patch.undo()


def open_tab(page, viewport: dict) -> None:
    """The tab's button, at the wide size (a phone folds the tab bar into a menu, and links do not name this tab),
    then the page narrowed to the viewport, before anything is drawn."""
    page.get_by_role("tab", name="Across texts").click()
    expect(page.locator("#corpus-heads-run")).to_be_visible(timeout=RUN_TIMEOUT_MS)
    page.set_viewport_size(viewport)


def inside(page, selector: str) -> None:
    plot = page.locator(f"{selector} .js-plotly-plot").first
    expect(plot).to_be_attached(timeout=RUN_TIMEOUT_MS)
    box, width = plot.bounding_box(), page.viewport_size["width"]
    assert box["width"] > 0 and box["x"] >= -1 and box["x"] + box["width"] <= width + 1, (selector, box, width)


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py), at 1400 px."""
    return shared_page


def test_head_scores_over_a_corpus_draw_inside_the_page(page):
    """The job run and read at 1400 px; then the window narrowed to a phone's width, where both figures fit."""
    open_tab(page, VIEWPORTS["wide"])
    page.locator("#corpus-n input").fill("8")
    page.locator("#corpus-row input").fill("1")
    page.locator("#corpus-col input").fill("2")
    page.locator("#corpus-heads-run").click()
    expect(page.locator("#corpus-note")).to_contain_text(
        re.compile(r"over 8 induction texts.*Done in", re.S), timeout=RUN_TIMEOUT_MS)   # this run's own note
    expect(page.locator("#corpus-note")).to_contain_text(LINE)
    inside(page, "#corpus-map")
    inside(page, "#corpus-strip")
    for figure in ("#corpus-map", "#corpus-strip"):   # the line on n and the interval, drawn in each figure
        expect(page.locator(f"{figure} .annotation-text").first).to_have_text(LINE)
    expect(page.locator("#corpus-strip .scatterlayer .point").nth(7)).to_be_attached()   # a dot per text (and the mean)
    # a click on another cell of the map redraws the strip for it (2 layers down, 4 heads across, layer 0 on top)
    tiles = page.locator("#corpus-map .js-plotly-plot .nsewdrag").first
    tiles.scroll_into_view_if_needed()
    box = tiles.bounding_box()
    corner = {"x": box["width"] * 3.5 / 4, "y": box["height"] * 1.5 / 2}
    tiles.hover(position=corner)
    expect(page.locator("#corpus-map .hoverlayer .hovertext").first).to_contain_text("layer 1, head 3",
                                                                                       timeout=10_000)
    hover = page.locator("#corpus-map .hoverlayer .hovertext").first.text_content()
    assert "mean" in hover and "interval [" in hover and "n = 8" in hover, hover   # mean, interval and n
    tiles.click(position=corner)
    expect(page.locator("#corpus-cell-note")).to_contain_text("Layer 1, head 3", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#corpus-strip .gtitle")).to_contain_text("layer 1, head 3")
    assert page.locator("#corpus-col input").input_value() == "3"
    # and so does a cell typed, then Enter
    page.locator("#corpus-row input").fill("0")
    page.locator("#corpus-col input").fill("0")
    page.locator("#corpus-col input").press("Enter")
    expect(page.locator("#corpus-cell-note")).to_contain_text("Layer 0, head 0", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#corpus-strip .gtitle")).to_contain_text("layer 0, head 0")
    # the finished job's files, from the saved job
    page.locator("#corpus-export").click()
    expect(page.locator("#corpus-export-files")).to_contain_text("_induction_items", timeout=RUN_TIMEOUT_MS)
    check_plane(page)
    screenshot(page, "corpus-wide")
    page.set_viewport_size(VIEWPORTS["phone"])
    try:
        settled(page)
        inside(page, "#corpus-map")
        inside(page, "#corpus-strip")
        screenshot(page, "corpus-phone")
    finally:
        page.set_viewport_size(VIEWPORTS["wide"])


def test_the_heads_tab_asks_how_typical_the_induction_score_is(page):
    page.get_by_role("tab", name="Heads").click()
    page.locator("#heads-typical").click()
    expect(page.get_by_role("tab", name="Across texts")).to_have_attribute("aria-selected", "true",
                                                                        timeout=RUN_TIMEOUT_MS)
    # the page still holds the previous test's finished note ("... over 8 induction texts ... Done in"), so
    # wait for this run's own finished note, not for any "Done in"
    expect(page.locator("#corpus-note")).to_contain_text(
        re.compile(r"The induction score over 20 induction texts.*Done in", re.S), timeout=RUN_TIMEOUT_MS)
    inside(page, "#corpus-map")


def test_the_patching_tabs_ioi_pair_asks_how_typical_it_is_in_its_direction(page):
    """The button shows for the IOI preset only (the other presets have no built-in corpus of their kind), and
    sends the tab's direction with IOI pairs to the Across texts tab, whose job runs: on the tiny tokenizer, which
    has no one-token names, it is refused in words."""
    page.get_by_role("tab", name="Patching").click()
    button = page.locator("#patching-typical")
    expect(button).to_be_visible(timeout=RUN_TIMEOUT_MS)
    page.locator("#patch-preset input").click()
    page.get_by_role("option", name="Fact: which city").click()
    expect(button).to_be_hidden()
    page.locator("#patch-preset input").click()
    page.get_by_role("option", name="IOI: who gets the drink").click()
    expect(button).to_be_visible()
    page.locator("#patch-more").get_by_text("Answer, foil and direction").click()   # open its accordion
    page.locator("#patch-mode").get_by_text("noise", exact=True).click()
    button.click()
    expect(page.get_by_role("tab", name="Across texts")).to_have_attribute("aria-selected", "true",
                                                                        timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#corpus-source input")).to_have_value("IOI pairs")
    page.locator("#corpus-patch-box").get_by_text("Patching (pairs)").click()   # open its accordion
    expect(page.locator("#corpus-mode").get_by_label("noise", exact=True)).to_be_checked()
    expect(page.locator(".toast-body").first).to_contain_text("too few single-token words for IOI prompts",
                                                              timeout=RUN_TIMEOUT_MS)


def check_plane(page) -> None:
    """The plane of one head over 3 induction texts (run on the page the heads test opened, to save opening
    another): queries and keys drawn as two traces of points, the line under them saying how many texts and
    tokens and the keys' shift; hovering a point names it, its text and its position."""
    page.locator("#corpus-n input").fill("3")
    page.locator("#corpus-qk-box").get_by_text("Query/key plane of one head").click()   # open its accordion
    page.locator("#corpus-qk-layer input").fill("1")
    page.locator("#corpus-qk-head input").fill("2")
    page.locator("#corpus-qk-run").click()
    expect(page.locator("#corpus-qk-note")).to_contain_text("Query/key plane", timeout=RUN_TIMEOUT_MS)
    inside(page, "#corpus-qk")
    traces = page.locator("#corpus-qk .scatterlayer .trace")
    expect(traces).to_have_count(2)
    tokens = 3 * (2 * INDUCTION_LENGTH + 1)   # 3 texts of twice the probe's length and a BOS each
    assert traces.nth(0).locator(".point").count() == tokens and traces.nth(1).locator(".point").count() == tokens
    line = page.locator("#corpus-qk .annotation-text").first
    expect(line).to_contain_text(f"3 texts: {tokens} of {tokens} tokens")
    expect(page.locator("#corpus-qk")).to_contain_text("AttentionViz")   # the plane's definition, named under it
    traces.nth(1).locator(".point").first.hover(force=True)
    hover = page.locator("#corpus-qk .hoverlayer .hovertext").first   # the nearest point: a key, maybe another
    expect(hover).to_contain_text(re.compile(r"key .*text [0-2], position \d+"), timeout=10_000)
