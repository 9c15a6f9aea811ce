"""The Lab's "Runs of this session" in a real browser (Debian's Chromium, headless, driven by Playwright): the
download box stays hidden until an export has put a file in it, and the runs table is never cut at the right
edge: every column fits at 1400 px, and on a 390 px phone the table stays within the window and scrolls inside its
own box until its last column is in view."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import WIDE, screenshot, settled  # noqa: E402
from test_browser_lab import LAB_ENV, NARROW, TIMEOUT_MS, tiny_config  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-lab-runs")
    with pytest.MonkeyPatch.context() as patch:  # the settings hold for the module, then go back
        for name, value in {**LAB_ENV, "ATTN_WEIGHTS_DIR": str(root / "weights")}.items():
            patch.setenv(name, value)
        llama = str(build_tiny_llama(root / "tiny-llama"))
        demo, url, _ = launch_app([llama], llama)
        yield url
        demo.close()


def train_one(page: Page) -> None:
    """A tiny run, waited for until the runs table lists it."""
    tiny_config(page, 20)
    page.locator("#lab-train").click()
    expect(page.locator("#lab-runs")).to_contain_text("run1", timeout=TIMEOUT_MS)


def table_fit(page: Page) -> dict:
    """The runs table's scroll box and its last header cell, before and after scrolling the box to its end."""
    return page.locator("#lab-runs").evaluate("""(table) => {
        const cells = table.querySelectorAll('thead th');
        const last = cells[cells.length - 1];
        let box = last.parentElement;
        while (box !== table && box.scrollWidth <= box.clientWidth) box = box.parentElement;
        const edge = () => ({cell: last.getBoundingClientRect().right, box: box.getBoundingClientRect().right});
        const before = edge();
        box.scrollLeft = box.scrollWidth;
        const after = edge();
        box.scrollLeft = 0;
        return {before, after, overflow: getComputedStyle(box).overflowX, wide: box.scrollWidth > box.clientWidth,
                table: table.getBoundingClientRect().right, window: window.innerWidth,
                page: document.documentElement.scrollWidth, last: last.textContent.trim()};
    }""")


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py): the run the first trains is the one the
    second's table lists."""
    shared_page.get_by_role("tab", name="Lab", exact=True).click()
    return shared_page


def test_the_download_box_shows_only_once_it_holds_a_file(page):
    expect(page.locator("#lab-export")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#lab-export-file")).to_be_hidden()
    train_one(page)
    expect(page.locator("#lab-export-file")).to_be_hidden()  # a run alone fills no download
    page.locator("#lab-export").click()
    expect(page.locator("#lab-export-note")).to_contain_text("1 run(s)", timeout=TIMEOUT_MS)
    expect(page.locator("#lab-export-file")).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#lab-export-file")).to_contain_text("lab-runs")


def test_the_runs_table_is_never_cut_at_the_right_edge(page):
    if "run1" not in page.locator("#lab-runs").inner_text():  # run alone: a run of its own
        train_one(page)
    for name, viewport in (("wide", WIDE), ("phone", NARROW)):   # the page at 1400 px, then at a phone's width
        page.set_viewport_size(viewport)
        try:
            settled(page)
            fit = table_fit(page)
            page.locator("#lab-runs").scroll_into_view_if_needed()
            screenshot(page, f"lab-runs-{name}")
        finally:
            page.set_viewport_size(WIDE)
        assert fit["last"].startswith("seconds"), fit  # the last column (its header also holds a menu button)
        assert fit["table"] <= fit["window"], f"the table passes the window's edge: {fit}"
        if name == "wide":  # every column in view as the page opens (a phone's page: test_browser_first_screen.py)
            assert fit["page"] <= fit["window"], f"the page scrolls sideways: {fit}"
            assert not fit["wide"] and fit["before"]["cell"] <= fit["before"]["box"] + 1, fit
        else:  # the table scrolls inside its own box, and its last column comes into view
            assert fit["overflow"] in ("auto", "scroll"), fit
            assert fit["after"]["cell"] <= fit["after"]["box"] + 1, fit
