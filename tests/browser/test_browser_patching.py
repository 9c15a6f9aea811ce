"""The Patching tab in a real browser (headless Chromium), on a tiny random model: no figure box before a result,
the sweep (its map opens on the first preset's), logit attribution and the flow graph drawn, a click on a head of
the attribution map opening it in the Attention tab, a click on a flow-graph edge saying why its heads attend there
(at 1400 px and on a phone), the sweep's colour bar saying what a cell means in each direction, and how good the
shortcuts are: the comparison draws one scatter panel per method (at 1400 px and on a phone), its note says that a
map can look right and rank the wrong heads, and a point's hover names its cell."""

from __future__ import annotations

import os
import re

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import WIDE, screenshot, settled  # noqa: E402

RUN_TIMEOUT_MS = 60_000
PHONE = {"width": 390, "height": 844}
CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py); the colour bar's test, which turns the
    direction to noising, comes last."""
    return shared_page


def drawn(page: Page, elem_id: str, layer: str = ".hm image") -> None:
    expect(page.locator(f"#{elem_id} .js-plotly-plot {layer}").first).to_be_attached(timeout=RUN_TIMEOUT_MS)


def test_patching_tab_measures_a_pair_and_a_head_click_opens_it(page):
    page.get_by_role("tab", name="Patching").click()
    expect(page.locator("#patch-run")).to_be_visible()
    for elem_id in ("patch-dla", "patch-flow"):   # the map opens on the first preset's (the first screen)
        assert page.locator(f"#{elem_id}").count() == 0 or not page.locator(f"#{elem_id}").is_visible()
    page.locator("#patch-clean textarea").fill(CLEAN)
    page.locator("#patch-corrupted textarea").fill(CORRUPTED)
    page.locator("#patch-run").click()
    drawn(page, "patch-map")
    expect(page.locator("#patch-note")).to_contain_text("on the clean prompt", timeout=RUN_TIMEOUT_MS)
    page.locator("#patch-dla-run").click()
    drawn(page, "patch-dla")
    expect(page.locator("#patch-dla-note")).to_contain_text("the model's own difference", timeout=RUN_TIMEOUT_MS)
    page.locator("#patch-flow-run").click()
    drawn(page, "patch-flow", ".scatterlayer .trace")
    expect(page.locator("#patch-flow-note")).to_contain_text("edges", timeout=RUN_TIMEOUT_MS)
    screenshot(page, "patching")
    # 2 layers across, 4 heads down: the bottom-right tile of the attribution map is layer 1, head 3
    tiles = page.locator("#patch-dla .js-plotly-plot .nsewdrag").first
    tiles.scroll_into_view_if_needed()
    box = tiles.bounding_box()
    corner = {"x": box["width"] * 0.75, "y": box["height"] * 0.85}
    tiles.hover(position=corner)
    expect(page.locator("#patch-dla .hoverlayer .hovertext").first).to_contain_text("L1 H3", timeout=10_000)
    tiles.click(position=corner)
    expect(page.get_by_role("tab", name="Attention")).to_have_attribute("aria-selected", "true",
                                                                        timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#attn-head-view")).to_contain_text("Layer 1, head 3", timeout=RUN_TIMEOUT_MS)
    assert page.locator("#attn-text textarea").input_value() == CLEAN


def open_patching(page: Page) -> None:
    page.get_by_role("tab", name="Patching").click()
    expect(page.locator("#patch-run")).to_be_visible()
    page.locator("#patch-clean textarea").fill(CLEAN)
    page.locator("#patch-corrupted textarea").fill(CORRUPTED)


def test_the_shortcut_scatter_is_drawn_and_names_its_cells(page):
    page.get_by_role("tab", name="Patching").click()
    expect(page.locator("#patch-run")).to_be_visible()
    assert page.locator("#patch-shortcut").count() == 0 or not page.locator("#patch-shortcut").is_visible()
    page.locator("#patch-clean textarea").fill(CLEAN)
    page.locator("#patch-corrupted textarea").fill(CORRUPTED)
    page.locator("#patch-shortcut-run").click()
    expect(page.locator("#patch-shortcut-note")).to_contain_text("rank the wrong heads", timeout=RUN_TIMEOUT_MS)
    panels = page.locator("#patch-shortcut .js-plotly-plot .scatterlayer .trace.scatter")
    expect(panels.first).to_be_attached(timeout=RUN_TIMEOUT_MS)
    expect(panels.nth(3)).to_be_attached()   # atp, atp*, ig, flow (each with its points; the signed ones a diagonal)
    expect(page.locator("#patch-shortcut .js-plotly-plot .annotation").last).to_contain_text("exact sweep")
    point = page.locator("#patch-shortcut .js-plotly-plot .scatterlayer .trace.scatter .points path").first
    point.scroll_into_view_if_needed()
    point.hover(force=True)
    expect(page.locator("#patch-shortcut .hoverlayer .hovertext").first).to_contain_text("exact",
                                                                                          timeout=10_000)
    expect(page.locator("#patch-shortcut .hoverlayer .hovertext").first).to_contain_text(" H")
    screenshot(page, "patching-shortcuts")
    # on a 390 px phone, the same page narrowed: the scatter fits the width and its panels' titles keep apart
    page.set_viewport_size(PHONE)
    try:
        shortcuts_on_a_phone(page)
    finally:
        page.set_viewport_size(WIDE)


def shortcuts_on_a_phone(page: Page) -> None:
    settled(page)
    figure = page.locator("#patch-shortcut .js-plotly-plot").first
    figure.scroll_into_view_if_needed()
    box = figure.bounding_box()
    assert box["x"] >= -1 and box["x"] + box["width"] <= PHONE["width"] + 1, box
    titles = page.evaluate("""() => [...document.querySelectorAll('#patch-shortcut .js-plotly-plot .annotation')]
        .map((a) => a.getBoundingClientRect()).filter((r) => r.width > 0)
        .map((r) => [r.left, r.top, r.right, r.bottom])""")
    assert titles, "the panels' titles are drawn"
    badge = page.locator('#patch-shortcut [data-testid="block-label"]')
    if badge.count() and badge.first.is_visible():    # a label's badge over the figure's title hides it
        b = badge.first.bounding_box()
        titles.append([b["x"], b["y"], b["x"] + b["width"], b["y"] + b["height"]])
    for left, top, right, bottom in titles:
        assert left >= box["x"] - 1 and right <= box["x"] + box["width"] + 1, (left, right, box)
    for i, a in enumerate(titles):
        for b in titles[i + 1:]:
            apart = min(a[2], b[2]) - max(a[0], b[0]) <= 1 or min(a[3], b[3]) - max(a[1], b[1]) <= 1
            assert apart, (a, b)
    screenshot(page, "patching-shortcuts-phone")


def test_a_click_on_a_flow_graph_edge_says_why_its_heads_attend_there(page):
    """A click on an attention edge's midpoint opens *Why this edge?* on that edge: its strongest head's query
    and key parts as bars and a link to the Inside tab at that head; on a phone the panel fits the width."""
    open_patching(page)
    page.locator("#patch-flow-threshold input[type=number]").fill("0.02")
    page.locator("#patch-flow-threshold input[type=number]").press("Enter")
    page.locator("#patch-flow-run").click()
    expect(page.locator("#patch-flow-note")).to_contain_text("edges of importance ≥ 0.02", timeout=RUN_TIMEOUT_MS)
    plot = page.locator("#patch-flow .js-plotly-plot")
    index = plot.evaluate("(el) => el._fullData.findIndex((t) => t.name === 'attention edge')")
    assert index >= 0, "no attention edge drawn"
    head, edge = plot.evaluate(f"(el) => [el._fullData[{index}].customdata[0][0], "
                               f"el._fullData[{index}].customdata[0][6]]")
    point = page.locator("#patch-flow .scatterlayer .trace").nth(index).locator(".point").first
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    layer, strongest = head.split(".")
    hover = page.locator("#patch-flow .hoverlayer .hovertext").first
    expect(hover).to_contain_text(f"heads: L{layer} H{strongest}", timeout=10_000)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    _, target, source = (int(n) for n in edge.removeprefix("edge ").split("."))
    note = page.locator("#patch-edge-note")
    expect(note).to_contain_text(f"layer {layer}'s attention from", timeout=RUN_TIMEOUT_MS)
    expect(note).to_contain_text(f"(position {target})")
    expect(note).to_contain_text(f"(position {source})")
    expect(note.locator("a").first).to_have_attribute("href", re.compile(
        f"tab=inside&layer={layer}&head={strongest}&token={target}"))
    expect(page.locator("#patch-edge .js-plotly-plot .barlayer .trace").first).to_be_attached(timeout=RUN_TIMEOUT_MS)
    page.set_viewport_size(PHONE)
    try:
        settled(page)
        figure = page.locator("#patch-edge .js-plotly-plot").first
        figure.scroll_into_view_if_needed()
        frame = figure.bounding_box()
        assert frame["x"] >= -1 and frame["x"] + frame["width"] <= PHONE["width"] + 1, frame
        for title in page.locator("#patch-edge .js-plotly-plot .annotation").all():
            b = title.bounding_box()
            assert b["x"] >= frame["x"] - 1 and b["x"] + b["width"] <= frame["x"] + frame["width"] + 1, b
        screenshot(page, "patching-edge-phone")
    finally:
        page.set_viewport_size(WIDE)


def test_the_sweeps_colour_bar_says_what_a_cell_means_in_each_direction(page):
    """Noise first, then denoise: the page still shows the first test's denoising sweep of the same pair, so each
    run's note is new on the page only in this order."""
    open_patching(page)
    title = page.locator("#patch-map .js-plotly-plot .cbtitle").first
    scale = page.locator("#patch-map .js-plotly-plot .colorbar").first   # its title and its ticks in words
    page.locator("#patch-more").get_by_text("Answer, foil and direction").click()
    page.locator("#patch-mode input[value=noise]").check()
    page.locator("#patch-run").click()
    # the run came back when the note names the direction it ran in
    expect(page.locator("#patch-note")).to_contain_text("corrupted activations written into the clean run",
                                                        timeout=RUN_TIMEOUT_MS)
    expect(title).to_have_text("kept")
    expect(scale).to_contain_text("1 no change")
    expect(scale).to_contain_text("0 needed")
    expect(scale).not_to_contain_text("back")
    expect(page.locator("#patch-note")).to_contain_text("this patch changes nothing")
    page.locator("#patch-mode input[value=denoise]").check()
    page.locator("#patch-run").click()
    expect(page.locator("#patch-note")).to_contain_text("clean activations written into the corrupted run",
                                                        timeout=RUN_TIMEOUT_MS)
    expect(title).to_have_text("restored")
    expect(scale).to_contain_text("clean answer back")
    expect(scale).to_contain_text("0 no change")
