"""The page's layout, exports and deep links in a real browser (Debian's Chromium, headless, Playwright).

The model card starts folded; at 1400 px wide the page never scrolls sideways (at 390 px: the phone walk of
test_browser_first_screen.py), controls sit beside the figures on the wide screen and above them on the narrow one;
the modebar saves PNG and SVG with the view's name; a tab's data download holds the numbers; a link opens its tab,
layer and head, a bad one falls back with a message; the copy-link button writes the state into a link; a model
copied into the weights folder appears in the picker when a page opens. Screenshots land in tests/screenshots/
(git-ignored).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
from urllib.parse import urlencode, urlsplit

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import (WIDE, close_toasts, drawn, idle, open_card, open_page, runs_done, screenshot,  # noqa: E402
                      settled, wait_for_run)
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402

TIMEOUT_MS = 60_000
NARROW = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-layout")
    saved = os.environ.get("ATTN_WEIGHTS_DIR")
    os.environ["ATTN_WEIGHTS_DIR"] = str(root / "weights")
    (root / "weights").mkdir()
    llama = str(build_tiny_llama(root / "tiny-llama"))
    demo, url, _ = launch_app([llama], llama)
    yield url, root
    demo.close()
    if saved is None:
        os.environ.pop("ATTN_WEIGHTS_DIR", None)
    else:
        os.environ["ATTN_WEIGHTS_DIR"] = saved


@pytest.fixture(scope="module")
def app_url(served):
    return served[0]


@pytest.fixture
def page(shared_page):
    """One page walked by the module's short tests in order (tests/conftest.py): the card first, then the export of
    the tab's opening head, the modebar, and both widths."""
    return shared_page


def no_sideways_scroll(page: Page) -> None:
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]"
    )
    assert max(widths[:2]) <= widths[2], f"the page scrolls sideways: scrollWidth {widths[:2]}, window {widths[2]}"


def box(page: Page, selector: str) -> dict:
    """The element's box in page coordinates (not the window's, which move as the page scrolls)."""
    return page.locator(selector).first.evaluate(
        "(e) => { const r = e.getBoundingClientRect();"
        " return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}; }"
    )


def test_the_model_card_starts_folded_and_opens(page):
    card = page.locator("#model-card")
    expect(page.locator("#model-card-box")).to_be_visible()
    expect(card).to_be_hidden()
    # the tabs start near the top: no half screen of card above them
    assert box(page, "button[role=tab]")["y"] < 400
    open_card(page)
    expect(card).to_contain_text("4d²")


def test_a_data_export_downloads_the_head_as_csv(page):
    # the tab opened on its clearest head; the file is named by the layer and head shown
    expect(page.locator("#attn-note")).to_contain_text("Opened on", timeout=TIMEOUT_MS)
    layer = page.locator("#attn-layer input").input_value()
    head = page.locator("#attn-head input").input_value()
    page.locator("#attn-export-box button, #attn-export-box .label-wrap").first.click()
    page.locator("#attn-export").click()
    link = page.locator("#attn-export-file a").first
    expect(link).to_be_visible(timeout=TIMEOUT_MS)
    with page.expect_download(timeout=TIMEOUT_MS) as info:
        link.click()
    download = info.value
    assert download.suggested_filename.endswith(f"_L{layer}_H{head}_head.csv"), (layer, head)
    lines = [line for line in open(download.path(), encoding="utf-8") if not line.startswith("#")]
    rows = list(csv.reader(lines))
    assert rows[0][0] == "query \\ key"
    for row in rows[1:]:
        assert abs(sum(float(c) for c in row[1:]) - 1.0) < 1e-4  # each query's weights sum to 1


def test_the_modebar_saves_png_and_svg_named_by_view(page):
    page.locator("#attn-layer input").fill("1")
    page.locator("#attn-head input").fill("2")
    page.locator("#attn-head input").press("Enter")
    page.locator("#attn-run").click()
    plot = page.locator("#attn-head-view .js-plotly-plot")
    expect(plot.locator(".hm image").first).to_be_attached(timeout=TIMEOUT_MS)
    expect(page.locator("#attn-head-view")).to_contain_text("Layer 1, head 2", timeout=TIMEOUT_MS)
    plot.scroll_into_view_if_needed()
    plot.hover()
    for title, suffix, magic in (("Download plot as a PNG", ".png", b"\x89PNG"), ("Download plot as SVG", ".svg",
                                                                                   b"<svg")):
        button = page.locator(f"#attn-head-view .modebar-btn[data-title='{title}']")
        with page.expect_download(timeout=TIMEOUT_MS) as info:
            button.click()
        download = info.value
        assert download.suggested_filename == f"tiny-llama_L1_H2_head-view{suffix}"
        data = open(download.path(), "rb").read()
        assert data.startswith(magic), data[:40]
        if suffix == ".png":  # 1600 × 900 at scale 2
            assert int.from_bytes(data[16:20], "big") == 3200 and int.from_bytes(data[20:24], "big") == 1800
        else:
            assert b'width="1600"' in data[:400]


def test_both_widths_render_without_sideways_scroll(page):
    """The walked page at 1400 px, then narrowed to a phone's 390 px on the Attention tab and on Positional
    encoding (a phone's sideways scroll is checked once per tab in test_browser_first_screen.py)."""
    page.get_by_role("tab", name="Attention", exact=True).click()
    before = runs_done(page, "attn-field-note")
    page.locator("#attn-run").click()
    wait_for_run(page, "attn-field-note", before)   # it redraws what the page opened on
    expect(page.locator("#attn-head-view .js-plotly-plot .hm image").first).to_be_attached(timeout=TIMEOUT_MS)
    settled(page)
    no_sideways_scroll(page)
    run, figure = box(page, "#attn-run"), box(page, "#attn-model-view")
    assert figure["x"] >= run["x"] + run["width"] - 1, (run, figure)  # wide: controls beside the figures
    screenshot(page, "layout-attention-wide")
    page.set_viewport_size(NARROW)
    try:
        settled(page)
        run, figure = box(page, "#attn-run"), box(page, "#attn-model-view")
        assert figure["y"] >= run["y"] + run["height"] - 1, (run, figure)  # narrow: controls above the figures
        screenshot(page, "layout-attention-narrow")
    finally:
        page.set_viewport_size(WIDE)
    # at 1400 px: every tab, opened from its button, fits the width once drawn
    for label, elem_id in (("Masks", "mask-run"), ("Heads", "heads-run"), ("Lab", "lab-train"),
                           ("Positional encoding", "pe-run")):
        page.get_by_role("tab", name=label, exact=True).click()
        expect(page.locator(f"#{elem_id}")).to_be_visible(timeout=TIMEOUT_MS)
        settled(page)
        no_sideways_scroll(page)
    page.locator("#pe-run").click()
    expect(page.locator("#pe-permutation")).to_contain_text("causal decoder", timeout=TIMEOUT_MS)
    no_sideways_scroll(page)
    screenshot(page, "layout-positions-wide")
    page.set_viewport_size(NARROW)
    try:
        settled(page)
        expect(page.locator("#pe-permutation")).to_contain_text("causal decoder")
        screenshot(page, "layout-positions-narrow")
    finally:
        page.set_viewport_size(WIDE)


def test_a_deep_link_opens_its_tab_layer_and_head(browser, app_url):
    url = app_url + "?" + urlencode({"tab": "attention", "layer": 1, "head": 3, "text": "The keeper lit the lamp."})
    context, page, errors = open_page(browser, url)
    try:
        expect(page.locator("#attn-head-view")).to_contain_text("Layer 1, head 3", timeout=TIMEOUT_MS)
        assert page.locator("#attn-text textarea").input_value() == "The keeper lit the lamp."
        page.goto(app_url + "?" + urlencode({"tab": "heads", "layer": 1, "head": 2}))
        expect(page.get_by_role("tab", name="Heads")).to_have_attribute("aria-selected", "true", timeout=TIMEOUT_MS)
        expect(page.locator("#heads-layer input")).to_have_value("1", timeout=TIMEOUT_MS)
        expect(page.locator("#heads-head input")).to_have_value("2")
        # the copy-link button writes the state back into a link
        page.locator("#copy-link").click()
        link = page.locator("#share-link textarea, #share-link input").first
        expect(link).to_have_value(lambda_free_pattern("tab=heads&layer=1&head=2"), timeout=TIMEOUT_MS)
        screenshot(page, "deep-link-heads")
    finally:
        context.close()
    assert not errors, errors


def lambda_free_pattern(fragment: str):
    import re

    return re.compile(re.escape(fragment))


def test_a_bad_link_falls_back_with_a_message(browser, app_url):
    url = app_url + "?" + urlencode({"tab": "nowhere", "layer": "99", "head": "x", "model": "not-a-model"})
    context, page, errors = open_page(browser, url)
    try:
        toasts = page.locator(".toast-body")
        expect(toasts.first).to_be_visible(timeout=TIMEOUT_MS)
        text = " ".join(toasts.all_inner_texts())
        assert "not offered here" in text or "does not exist" in text or "out of range" in text, text
        expect(page.get_by_role("tab", name="Attention")).to_have_attribute("aria-selected", "true")
        # layer 99 was not taken: the tab opened on its clearest head, and says which
        expect(page.locator("#attn-note")).to_contain_text("Opened on", timeout=TIMEOUT_MS)
        opened = re.search(r"Opened on L(\d+) H(\d+)", page.locator("#attn-note").inner_text())
        assert opened and page.locator("#attn-layer input").input_value() == opened.group(1)
        assert "Traceback" not in page.content()
    finally:
        context.close()
    assert not errors, errors


def test_a_model_copied_into_weights_appears_when_a_page_opens(browser, served):
    url, root = served
    shutil.copytree(root / "tiny-llama", root / "weights" / "copied-by-hand")
    context, page, errors = open_page(browser, url)
    try:
        page.locator("#model-picker input").click()
        expect(page.get_by_role("option", name="copied-by-hand", exact=True)).to_be_visible(timeout=TIMEOUT_MS)
    finally:
        context.close()
    assert not errors, errors


MARKUP = {  # what a hostile link or input could try to put into the page: a link, an image that loads, styled text
    "link": '<a id="injected-link" href="https://example.invalid/">Sign in again</a>',
    "image": '<img id="injected-image" src="https://example.invalid/pixel.png">',
    "styled": '<b id="injected-bold" style="font-size:40px">BIG</b>',
}


def no_markup_landed(page: Page, requests: list[str]) -> None:
    """No element the markup would have made, and no request to the host it names: it stayed text."""
    assert page.locator("#injected-link, #injected-image, #injected-bold").count() == 0
    assert not [r for r in requests if urlsplit(r).hostname == "example.invalid"], requests


def test_markup_in_a_link_or_a_message_stays_text(browser, app_url):
    """Every deep-link parameter, and a message that quotes the user's input, shown as the characters typed: one
    page whose link carries each kind of markup in some parameter, then each kind typed where a message quotes it."""
    kinds = list(MARKUP)
    params = {"model": MARKUP[kinds[0]], "tab": MARKUP[kinds[1]], "layer": MARKUP[kinds[2]], "head": MARKUP[kinds[0]]}
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))  # before the page loads: every request
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(app_url + "?" + urlencode(params))
    try:
        toasts = page.locator(".toast-body")
        expect(toasts.first).to_be_visible(timeout=TIMEOUT_MS)
        idle(page)
        text = " ".join(toasts.all_inner_texts())
        for kind in kinds:
            assert MARKUP[kind][:20] in text, (kind, text)  # quoted as written
        drawn(page)
        no_markup_landed(page, requests)
        # a message that quotes what the user typed: a head that is no head, in the Heads tab's ablation list
        page.get_by_role("tab", name="Heads").click()
        for kind in kinds:
            close_toasts(page)
            page.locator("#heads-ablate-list textarea, #heads-ablate-list input").first.fill(MARKUP[kind])
            page.locator("#heads-ablate").click()
            expect(toasts.filter(has_text="is not a head")).to_be_visible(timeout=TIMEOUT_MS)
            drawn(page)   # the message is on screen: any element its markup made would be too
            no_markup_landed(page, requests)
    finally:
        context.close()
    assert not errors, errors
