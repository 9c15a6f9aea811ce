"""The page's look-up script (ui/lookup.py) in Chromium, on a small page of its own: a glossary term in the app's
prose and labels becomes an <abbr> with its definition, "eq. 2.1" a link that opens the theory panel at that
equation; a field's value and escaped markup stay as they were; text Gradio rewrites is annotated afresh."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")

import gradio as gr  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

from conftest import WIDE  # noqa: E402
from ui.glossary import GLOSSARY  # noqa: E402
from ui.lookup import build_lookup  # noqa: E402

TIMEOUT_MS = 10_000
PROSE = "Scores go through the softmax of eq. 2.1, and &lt;b&gt;x&lt;/b&gt; is shown as typed."
FIELD = "softmax, typed by a reader"
COVERED = "The KV cache\n\nSee eq. 2.1 for the scores."   # a definition shown under the term covers the link


@pytest.fixture(scope="module")
def lookup_url():
    with gr.Blocks(analytics_enabled=False) as demo:
        prose = gr.Markdown(PROSE, elem_id="lk-prose")
        gr.Textbox(FIELD, label="Your text", elem_id="lk-field")
        number = gr.Number(1.0, label="Temperature of the softmax", elem_id="lk-number")
        gr.Markdown(COVERED, elem_id="lk-covered")
        change = gr.Button("change", elem_id="lk-change")
        js = build_lookup()
        change.click(lambda: ("Now the KV cache of eq. 6.9.", gr.Number(label="Strength of the causal mask")),
                     None, [prose, number], queue=False)
        demo.load(None, js=js)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()


@pytest.fixture
def page(browser, lookup_url):
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(lookup_url)
    yield page
    context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def test_terms_get_their_definition_and_equations_open_the_theory_panel(page):
    gloss = page.locator("#lk-prose abbr.gloss")
    expect(gloss).to_have_count(1, timeout=TIMEOUT_MS)
    expect(gloss).to_have_text("softmax")
    expect(gloss).to_have_attribute("title", GLOSSARY["softmax"])
    expect(gloss).to_have_attribute("tabindex", "0")
    expect(page.locator("#lk-number abbr.gloss")).to_have_text("softmax")  # a label is the app's prose too
    gloss.focus()  # the keyboard (and a tap) shows the definition too, not only the pointer's hover
    shown = page.evaluate("() => getComputedStyle(document.activeElement, '::after').content")
    assert GLOSSARY["softmax"] in shown, shown

    # the field's value is the reader's: not wrapped, not changed
    expect(page.locator("#lk-field textarea")).to_have_value(FIELD)
    expect(page.locator("#lk-field abbr")).to_have_count(0)
    # escaped markup stays text: no <b> element, the characters shown as written
    expect(page.locator("#lk-prose b")).to_have_count(0)
    expect(page.locator("#lk-prose")).to_contain_text("<b>x</b> is shown as typed.")
    expect(page.locator("#lk-prose")).to_contain_text(PROSE.replace("&lt;", "<").replace("&gt;", ">"))

    link = page.locator("#lk-prose a.eq-link")
    expect(link).to_have_text("eq. 2.1")
    content = page.locator("#theory-panel [data-testid='accordion-content']")
    expect(content).to_be_hidden()
    link.click()
    expect(content).to_be_visible(timeout=TIMEOUT_MS)
    target = page.locator("#theory-panel #eq-2-1")
    expect(target).to_be_in_viewport(timeout=TIMEOUT_MS)
    expect(target).to_contain_text("scaled dot-product attention")
    expect(target).to_be_focused()


def test_text_gradio_rewrites_is_annotated_afresh(page):
    expect(page.locator("#lk-prose abbr.gloss")).to_have_count(1, timeout=TIMEOUT_MS)
    page.locator("#lk-change").click()
    expect(page.locator("#lk-prose abbr.gloss")).to_have_text("KV cache", timeout=TIMEOUT_MS)
    expect(page.locator("#lk-prose a.eq-link")).to_have_text("eq. 6.9")
    label = page.locator("#lk-number [data-testid='block-info']")
    expect(label.locator("abbr.gloss")).to_have_text("causal mask", timeout=TIMEOUT_MS)
    # the old label's words are gone, not left beside the new ones
    expect(label).to_have_text("Strength of the causal mask")


def test_a_shown_definition_closes_on_escape_and_a_tap_on_the_link_it_covers_reaches_the_link(page):
    term = page.locator("#lk-covered abbr.gloss")
    expect(term).to_have_text("KV cache", timeout=TIMEOUT_MS)
    link = page.locator("#lk-covered a.eq-link")
    shown = "() => getComputedStyle(document.querySelector('#lk-covered abbr.gloss'), '::after').content"
    term.focus()                                  # a tap or the keyboard shows the definition
    assert GLOSSARY["KV cache"] in page.evaluate(shown)
    page.keyboard.press("Escape")                 # and Escape closes it
    assert page.evaluate(shown) == "none"
    term.focus()
    box = link.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    covered = page.evaluate("""([x, y]) => { const t = document.querySelector('#lk-covered abbr.gloss');
        const r = t.getBoundingClientRect(); return y > r.bottom && y < r.bottom + 4 * r.height; }""", [x, y])
    assert covered, "the check needs the definition's box over the link"
    assert page.evaluate("([x, y]) => document.elementFromPoint(x, y).closest('a')?.className", [x, y]) == "eq-link"
    page.mouse.click(x, y)                        # the tap reaches the link under the definition
    expect(page.locator("#theory-panel #eq-2-1")).to_be_in_viewport(timeout=TIMEOUT_MS)
    assert page.evaluate(shown) == "none"         # and the definition closed as focus moved
