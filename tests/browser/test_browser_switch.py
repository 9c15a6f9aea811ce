"""One model on the page at a time, and a share link that names the tab on screen, in a real browser (headless
Chromium) on two tiny random models of different shapes: a causal Llama (2 layers × 4 heads) and a BERT encoder
(3 layers × 8 heads).

After a model change the tab on screen shows its first screen computed for the new model, every other result is
cleared with a line that says which button to press, and a tab opened later computes its first screen for the new
model: no title, note or range of the old model remains in any tab.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from urllib.parse import quote

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import open_page  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402

TIMEOUT_MS = 60_000
# what the Llama's results say of it (its name, its shape, its ranges); none may remain after the switch
OLD = ["tiny-llama", "causal (decoder)", "× 4 heads", "model's 8 heads", "0–1)", "0–3)", "0–3,"]
# tab → (what shows that its Llama result is on screen, what shows the BERT's once the switch came back)
TABS = {
    "Generate": (("#gen-stats", "done"), ("#gen-stats", "press Generate")),
    "Attention": (("#attn-note", "model's 8 heads"), ("#attn-note", "model's 24 heads")),
    "Positional encoding": (("#pe-learned", "no learned position table"), ("#pe-rope-angles", "not RoPE")),
    "Masks": (("#mask-stage-on-scores", "tokens"), ("#mask-stage-on-scores", "[CLS]")),
    "Heads": (("#heads-note", "Induction probe"), ("#heads-note", "This model is an encoder")),
    "Patching": (("#patch-note", "same number of tokens"), ("#patch-note", "this model is an encoder")),
    "Inside": (("#inside-note", "tiny-llama"), ("#inside-note", "tiny-bert")),
}
# results beyond a tab's first screen: (button, its note) run before the switch, whose note then says what to press
EXTRA = {"Heads": ("#heads-lens-run", "#heads-lens-note"), "Patching": ("#patch-dla-run", "#patch-dla-note"),
         "Inside": ("#inside-why-run", "#inside-why-note")}

PANEL_TEXT = """() => {
  const panel = [...document.querySelectorAll('[role=tabpanel]')].find((p) => p.offsetParent !== null);
  const parts = [panel.innerText];
  for (const t of panel.querySelectorAll('.js-plotly-plot text')) {
    if (t.getBoundingClientRect().width > 0) parts.push(t.textContent);
  }
  return parts.join('\\n');
}"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("switch-models")
    llama = str(build_tiny_llama(root / "tiny-llama"))
    bert = str(build_tiny_bert(root / "tiny-bert", layers=3, heads=8))
    demo, url, services = launch_app([llama, bert], llama)
    yield url, services, demo
    demo.close()


def open_tab(page: Page, label: str) -> None:
    page.get_by_role("tab", name=label, exact=True).click()


def choose_bert(page: Page) -> None:
    page.locator("#model-picker input").click()
    page.get_by_role("option", name=re.compile("tiny-bert")).click()


def show_llama_results(page: Page, label: str) -> None:
    """The tab's Llama results on screen: its first screen, Generate's continuation, one more section."""
    open_tab(page, label)
    (where, text), _ = TABS[label]
    if label == "Generate":
        page.locator("#gen-run").click()
    expect(page.locator(where)).to_contain_text(text, timeout=TIMEOUT_MS)
    if label in EXTRA:
        button, note = EXTRA[label]
        page.locator(button).click()
        expect(page.locator(note)).not_to_be_empty(timeout=TIMEOUT_MS)


def old_left(page: Page, label: str) -> list[str]:
    """What the tab on screen still says of the Llama: OLD, and what its own Llama result says (but "tokens")."""
    text = page.evaluate(PANEL_TEXT)
    own = TABS[label][0][1]
    return [marker for marker in [*OLD, *([own] if label != "Masks" else [])] if marker in text]


# Attention is the tab on screen at the switch in the test below (which then opens every other tab), so it is
# not opened again here
@pytest.mark.parametrize("label", [label for label in TABS if label != "Attention"])
def test_a_model_switch_leaves_nothing_of_the_old_model_in_the_tab_on_screen(browser, served, label):
    url, *_ = served
    context, page, errors = open_page(browser, url)
    try:
        show_llama_results(page, label)
        assert old_left(page, label), "the check reads the Llama's results before the switch"
        choose_bert(page)
        where, text = TABS[label][1]
        expect(page.locator(where)).to_contain_text(text, timeout=TIMEOUT_MS)  # the switch came back
        if label in EXTRA:
            expect(page.locator(EXTRA[label][1])).to_contain_text("press", timeout=TIMEOUT_MS)
        assert not old_left(page, label), f"{label}: the old model's {old_left(page, label)} after the switch"
        if label == "Generate":
            assert page.locator("#gen-output textarea").input_value() == ""
    finally:
        context.close()
    assert not errors, errors


def test_after_a_switch_every_other_tab_opens_on_the_new_model(browser, served):
    url, *_ = served
    context, page, errors = open_page(browser, url)
    try:
        for label in TABS:
            show_llama_results(page, label)
        open_tab(page, "Attention")
        choose_bert(page)   # with Attention on screen
        expect(page.locator("#attn-note")).to_contain_text("model's 24 heads", timeout=TIMEOUT_MS)
        assert not old_left(page, "Attention"), f"the old model's {old_left(page, 'Attention')} after the switch"
        for label, (_, (where, text)) in TABS.items():
            open_tab(page, label)
            expect(page.locator(where)).to_contain_text(text, timeout=TIMEOUT_MS)
            assert not old_left(page, label), f"{label}: the old model's {old_left(page, label)} after the switch"
    finally:
        context.close()
    assert not errors, errors


def test_the_share_link_names_the_tab_chosen_while_the_page_opened(browser, served, monkeypatch):
    url, services, _ = served
    models, released = services.models, threading.Event()
    names_ready = models.names_ready

    def slow_names():  # the page's opening event (it reads the link) comes back after the user changed tabs
        released.wait(30)
        return names_ready()

    monkeypatch.setattr(models, "names_ready", slow_names)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{url}?layer=1")  # no tab in the link: the page opens on Attention
        open_tab(page, "Masks")
        expect(page.get_by_role("tab", name="Masks", exact=True)).to_have_attribute("aria-selected", "true")
        # the tab's own opening has run (so has its select); only then does the page's opening event return
        expect(page.locator("#mask-stage-on-scores .js-plotly-plot .main-svg").first).to_be_attached(
            timeout=TIMEOUT_MS)
        released.set()
        # the opening came back: it set the Attention tab's layer from the link
        expect(page.locator("#attn-layer input")).to_have_value("1", timeout=TIMEOUT_MS)
        page.locator("#copy-link").click()
        expect(page.locator("#share-link textarea, #share-link input").first).to_have_value(
            re.compile(r"tab=masks"), timeout=TIMEOUT_MS)
    finally:
        released.set()
        context.close()


def test_a_link_to_a_head_of_another_model_opens_that_head(browser, served, monkeypatch):
    url, services, demo = served
    bert = next(name for name in services.models.names() if name.endswith("tiny-bert"))
    switched = threading.Event()  # the page's model change (to the link's model) has come back
    for block_fn in demo.fns.values():
        if getattr(block_fn.fn, "__name__", "") == "follow_model":  # every tab's follow-up of the change
            def signalled(*args, _fn=block_fn.fn, **kwargs):
                try:
                    return _fn(*args, **kwargs)
                finally:
                    switched.set()

            monkeypatch.setattr(block_fn, "fn", functools.update_wrapper(signalled, block_fn.fn))
    context, page, errors = open_page(browser, f"{url}?model={quote(bert)}&layer=2&head=5")
    try:
        expect(page.locator("#attn-head-view")).to_contain_text("Layer 2, head 5", timeout=TIMEOUT_MS)
        assert switched.wait(60), "the model change never came back"
        page.locator("#copy-link").click()  # the link reads the page's layer and head after every event above
        expect(page.locator("#share-link textarea, #share-link input").first).to_have_value(
            re.compile(r"tab=attention&layer=2&head=5"), timeout=TIMEOUT_MS)
        expect(page.locator("#attn-head-view")).to_contain_text("Layer 2, head 5")
        assert "Opened on" not in page.locator("#attn-note").inner_text()
    finally:
        context.close()
    assert not errors, errors
