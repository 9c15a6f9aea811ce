"""The Masks tab in a real browser (Debian's Chromium, headless, Playwright), on a tiny random model.

At 1400 × 1000 the button is above the fold and no figure box shows before a result; after a run, the six stages
and the three measurements are drawn, no two figure boxes overlap (at 1400 and at 390 px, where they stack in one
column), every title and subtitle stays inside its figure, and the padding mask's zero bars are marked. Screenshots
masks-wide and masks-narrow land in tests/screenshots/ (git-ignored).
"""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import WIDE, drawn, runs_done, screenshot, settled, wait_for_run  # noqa: E402

TIMEOUT_MS = 60_000
NARROW = {"width": 390, "height": 844}
FOLD = 1000  # the wide window's height
FIGURES = [f"mask-stage-{mask}-{stage}" for mask in ("on", "off") for stage in ("scores", "masked", "softmax")] + [
    "mask-causal", "mask-padding", "mask-entropy"]


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app[0]  # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py)


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py); the narrow window comes last."""
    return shared_page


def box(page: Page, selector: str) -> dict:
    """The element's box in page coordinates."""
    return page.locator(selector).first.evaluate(
        "(e) => { const r = e.getBoundingClientRect();"
        " return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}; }"
    )


def open_masks(page: Page) -> None:
    page.get_by_role("tab", name="Masks").click()
    expect(page.locator("#mask-run")).to_be_visible(timeout=TIMEOUT_MS)
    first_screen(page)


def first_screen(page: Page) -> None:
    """The tab's opening result has come back and is drawn (it opens on the default text's stages)."""
    for elem_id in FIGURES[:6]:
        expect(page.locator(f"#{elem_id} .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
    drawn(page)


def run_masks(page: Page) -> None:
    """Run, and wait for this run's return (it draws the figures the tab's opening drew, so their presence says
    nothing), then for every figure and the last ones' relayout."""
    before = runs_done(page, "mask-field-note")
    page.locator("#mask-run").click()
    wait_for_run(page, "mask-field-note", before)
    for elem_id in FIGURES:
        expect(page.locator(f"#{elem_id} .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
    expect(page.locator("#mask-padding .js-plotly-plot .scatterlayer .point").first).to_be_attached(
        timeout=TIMEOUT_MS)
    settled(page)  # the last figures' relayout


def figure_boxes(page: Page) -> dict[str, dict]:
    """The box (page coordinates) of every visible figure of the Masks tab: each plot component's drawn figure."""
    return page.evaluate(
        """(ids) => Object.fromEntries(ids.map((id) => {
             const plot = document.querySelector(`#${id} .js-plotly-plot`);
             if (!plot || plot.offsetParent === null) return [id, null];
             const r = plot.getBoundingClientRect();
             return [id, {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}];
           }))""",
        FIGURES,
    )


def assert_no_empty_figure(page: Page) -> None:
    """Before the button is pressed, each figure box is hidden, or (should the tab show a first result when it
    opens) holds a drawn figure: never an empty box."""
    for elem_id in FIGURES:
        if page.locator(f"#{elem_id}").is_visible():
            expect(page.locator(f"#{elem_id} .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)


def overlaps(a: dict, b: dict) -> bool:
    # a pixel of slack: neighbouring boxes may share an edge after rounding
    return (a["x"] + a["width"] - 1 > b["x"] and b["x"] + b["width"] - 1 > a["x"]
            and a["y"] + a["height"] - 1 > b["y"] and b["y"] + b["height"] - 1 > a["y"])


def assert_no_overlap(boxes: dict[str, dict]) -> None:
    shown = {name: b for name, b in boxes.items() if b is not None}
    assert set(shown) == set(FIGURES), f"figures not shown: {set(FIGURES) - set(shown)}"
    names = list(shown)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not overlaps(shown[a], shown[b]), (a, shown[a], b, shown[b])


def titles_outside_their_figure(page: Page) -> list[str]:
    """Every title and subtitle of the tab's figures that runs past its figure's left or right edge."""
    return page.evaluate(
        """(ids) => ids.flatMap((id) => {
             const plot = document.querySelector(`#${id} .js-plotly-plot`);
             if (!plot) return [];
             const edge = plot.getBoundingClientRect();
             return [...plot.querySelectorAll('.gtitle, .gtitle-subtitle')].filter((t) => {
               const r = t.getBoundingClientRect();
               return r.width > 0 && (r.left < edge.left - 1 || r.right > edge.right + 1);
             }).map((t) => `${id}: ${t.textContent} (${Math.round(r(t).right)} > ${Math.round(edge.right)})`);
             function r(t) { return t.getBoundingClientRect(); }
           })""",
        FIGURES,
    )


def test_wide_the_button_is_above_the_fold_and_no_figure_shows_before_a_result(page):
    open_masks(page)
    run = box(page, "#mask-run")
    assert run["y"] + run["height"] <= FOLD, f"the button ends at y = {run['y'] + run['height']:.0f}"
    assert_no_empty_figure(page)
    # the window and the padding texts wait, folded, under the button
    assert box(page, "#mask-options")["y"] > run["y"]
    run_masks(page)
    first = box(page, "#mask-stage-on-scores")
    assert first["y"] < FOLD, f"the first figure starts at y = {first['y']:.0f}"
    boxes = figure_boxes(page)
    assert_no_overlap(boxes)
    # three stages a row beside each other on the wide screen: on above off
    on, off = boxes["mask-stage-on-scores"], boxes["mask-stage-off-scores"]
    assert boxes["mask-stage-on-softmax"]["y"] == pytest.approx(on["y"], abs=2) and off["y"] >= on["y"] + on["height"]
    assert titles_outside_their_figure(page) == []
    expect(page.locator("#mask-stages .js-plotly-plot .hm image")).to_have_count(6)
    screenshot(page, "masks-wide")


def test_a_zero_bar_of_the_padding_mask_is_a_dot_on_the_baseline(page):
    open_masks(page)
    run_masks(page)
    plot = page.locator("#mask-padding .js-plotly-plot")
    dots = plot.locator(".scatterlayer .point")
    expect(dots.first).to_be_attached()
    dot = dots.first.bounding_box()
    axis = plot.locator(".xaxislayer-above, .xaxislayer").first.bounding_box()
    assert dot["width"] > 4 and dot["height"] > 4  # seen, not a zero-height bar
    assert abs(dot["y"] + dot["height"] / 2 - axis["y"]) < 30, (dot, axis)  # at the baseline, just above the axis
    expect(plot.locator(".legend")).to_contain_text("padding mask on: exactly 0")


def test_narrow_the_figures_stack_in_one_column_without_overlap(page):
    open_masks(page)  # the tab on screen at the wide size, then the window narrowed to a phone's width
    page.set_viewport_size(NARROW)
    try:
        expect(page.locator("#mask-run")).to_be_visible(timeout=TIMEOUT_MS)
        run_masks(page)
        boxes = figure_boxes(page)
        assert_no_overlap(boxes)
        stages = [boxes[name] for name in FIGURES[:6]]
        assert all(b["x"] == pytest.approx(stages[0]["x"], abs=2) for b in stages), stages  # one column
        assert all(b["x"] + b["width"] <= NARROW["width"] + 1 for b in boxes.values()), boxes
        assert titles_outside_their_figure(page) == []
        screenshot(page, "masks-narrow")
    finally:
        page.set_viewport_size(WIDE)
