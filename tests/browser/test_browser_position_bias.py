"""The Positional encoding tab's bias view in a real browser (Debian's Chromium, headless, Playwright), on a tiny
random Llama: at 1400 × 1000 and on a 390 px phone, the two figures are hidden until the button is pressed, then
drawn side by side (wide) or one above the other (phone) without overlap and within the window, every title inside
its figure, and the note saying whose numbers they are. Screenshots position-bias-wide and
position-bias-narrow land in tests/screenshots/ (git-ignored)."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import WIDE, screenshot, settled  # noqa: E402

TIMEOUT_MS = 60_000
NARROW = {"width": 390, "height": 844}
FIGURES = ["pb-first", "pb-second"]


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    # one app for the neighbouring modules on the tiny Llama alone (tests/conftest.py); a link opens the tab
    return f"{tiny_llama_app[0]}?tab=positions"


def boxes(page: Page) -> dict[str, dict | None]:
    """The box (page coordinates) of each figure's drawn plot; None where it is not shown."""
    return page.evaluate(
        """(ids) => Object.fromEntries(ids.map((id) => {
             const plot = document.querySelector(`#${id} .js-plotly-plot`);
             if (!plot || plot.offsetParent === null) return [id, null];
             const r = plot.getBoundingClientRect();
             return [id, {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}];
           }))""",
        FIGURES,
    )


def titles_outside_their_figure(page: Page) -> list[str]:
    """Every title, subtitle and note written on a figure that runs past its left or right edge."""
    return page.evaluate(
        """(ids) => ids.flatMap((id) => {
             const plot = document.querySelector(`#${id} .js-plotly-plot`);
             if (!plot) return [];
             const edge = plot.getBoundingClientRect();
             return [...plot.querySelectorAll('.gtitle, .gtitle-subtitle, .annotation-text')].filter((t) => {
               const r = t.getBoundingClientRect();
               return r.width > 0 && (r.left < edge.left - 1 || r.right > edge.right + 1);
             }).map((t) => `${id}: ${t.textContent}`);
           })""",
        FIGURES,
    )


EQUATION = {"alibi": "eq. 6.3", "t5": "eq. 6.4", "rope-partial": "eq. 6.2"}  # each kind's note cites its own


def show(page: Page, kind: str) -> None:
    """Choose the kind, press the button, and wait for both figures and this kind's note (not the previous one's)."""
    page.locator("#pb-kind input").click()
    page.get_by_role("option", name=kind, exact=True).click()
    page.locator("#pb-run").click()
    for elem_id in FIGURES:
        expect(page.locator(f"#{elem_id} .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
    expect(page.locator("#pb-note")).to_contain_text(EQUATION[kind], timeout=TIMEOUT_MS)
    settled(page)  # the figures' relayout


def overlaps(a: dict, b: dict) -> bool:
    return (a["x"] + a["width"] - 1 > b["x"] and b["x"] + b["width"] - 1 > a["x"]
            and a["y"] + a["height"] - 1 > b["y"] and b["y"] + b["height"] - 1 > a["y"])


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py), opened by a link on the tab; the
    narrow window comes last."""
    expect(shared_page.locator("#pb-run")).to_be_attached(timeout=TIMEOUT_MS)
    shared_page.locator("#pb-run").scroll_into_view_if_needed()
    return shared_page


def test_wide_the_figures_sit_side_by_side_and_say_whose_numbers(page):
    assert all(b is None for b in boxes(page).values())  # no empty figure box before the button
    show(page, "alibi")
    first, second = boxes(page).values()
    assert not overlaps(first, second) and first["y"] == pytest.approx(second["y"], abs=2)  # side by side
    assert titles_outside_their_figure(page) == []
    expect(page.locator("#pb-note")).to_contain_text("The formula, not this model")
    show(page, "rope-partial")
    expect(page.locator("#pb-note")).to_contain_text("This model's own full rotary")
    expect(page.locator("#pb-second .js-plotly-plot .scatterlayer .trace")).to_have_count(2)  # full and partial
    assert titles_outside_their_figure(page) == []
    screenshot(page, "position-bias-wide")


def test_narrow_the_figures_stack_in_one_column_within_the_phone(page):
    page.set_viewport_size(NARROW)
    try:
        show(page, "t5")
        first, second = boxes(page).values()
        assert not overlaps(first, second) and first["x"] == pytest.approx(second["x"], abs=2)  # one column
        assert all(b["x"] + b["width"] <= NARROW["width"] + 1 for b in (first, second)), (first, second)
        assert titles_outside_their_figure(page) == []
        expect(page.locator("#pb-note")).to_contain_text("no T5 bias table")
        screenshot(page, "position-bias-narrow")
    finally:
        page.set_viewport_size(WIDE)
