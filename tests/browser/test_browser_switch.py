"""One model on the page at a time, and a share link that names the tab on screen, in a real browser (headless
Chromium) on two tiny random models of different shapes: a causal Llama (2 layers × 4 heads) and a BERT encoder
(3 layers × 8 heads).

One page walks the seven tabs and switches the model at each, Llama → BERT and back in turn (a switch is one
event, cheaper than a fresh page). On each tab: it opens on the model loaded now with nothing of the other (its
fields' ranges followed every switch while it was hidden) and shows its results for that model (its first screen,
Generate's continuation, one section beyond the first screen); the model is switched with the tab on screen, and
the tab then shows its first screen computed for the new model, its other results cleared with a line that says
which button to press (or, where that button cannot run on the new model, why), and nothing of the old model (its
name, its shape, its ranges, what its results said).
Then the tab walked before it, which showed the old model's first screen and was hidden during that switch, opens
on the new model's first screen with nothing of the old one. So each tab is checked on screen at a switch, and
each but Generate (walked last; it has no first screen to compute again) hidden at the next switch, in the other
direction: on screen, Llama → BERT on Attention, Heads, Patching and Generate (the BERT's results there are an
encoder's refusal on Patching and Generate, so a switch from them would remove little) and BERT → Llama on
Positional encoding, Masks and Inside; hidden, the other way round.

The share link made after the page's opening came back late names the tab its user chose in the meantime; a link
to a head of the model not loaded opens that model with that head drawn, and the page's link then names it.
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

from conftest import open_page, settled  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402

TIMEOUT_MS = 60_000
LLAMA, BERT = "tiny-llama", "tiny-bert"  # the ends of the two models' names
# what each model's results say of it (its name, its shape, its ranges, what only it says); none may remain in a
# tab after a switch to the other model
OLD = {
    LLAMA: [LLAMA, "causal (decoder)", "× 4 heads", "model's 8 heads", "0–1)", "0–3)", "0–3,"],
    BERT: [BERT, "bidirectional (encoder)", "× 8 heads", "model's 24 heads", "0–2)", "0–7)", "0–7,", "is an encoder",
           "not RoPE", "learned position embeddings", "no language-model head"],
}
# tab → model → what shows that the tab's result for that model is on screen (its first screen; on Generate the
# Llama's continuation, and the line after a switch to the BERT, which cannot generate). Each says what only that
# model's result says, so it is also what of the old model must be gone after a switch.
TABS = {
    "Attention": {LLAMA: ("#attn-note", "model's 8 heads"), BERT: ("#attn-note", "model's 24 heads")},
    "Positional encoding": {LLAMA: ("#pe-learned", "no learned position table"),
                            BERT: ("#pe-rope-angles", "not RoPE")},
    "Heads": {LLAMA: ("#heads-note", "Induction probe"), BERT: ("#heads-note", "This model is an encoder")},
    # the stage figure's first token label: the Llama's is the text's first word, the BERT's is [CLS]
    "Masks": {LLAMA: ("#mask-stage-on-scores", "0 Every"), BERT: ("#mask-stage-on-scores", "[CLS]")},
    "Patching": {LLAMA: ("#patch-note", "same number of tokens"), BERT: ("#patch-note", "this model is an encoder")},
    # the walk's own line (a line from a switch also names the model: "Now on …/tiny-bert: press Walk through")
    "Inside": {LLAMA: ("#inside-note", f"{LLAMA}, following"), BERT: ("#inside-note", f"{BERT}, following")},
    # after a switch to the BERT the line says why it cannot generate (not "press Generate", which it cannot)
    "Generate": {LLAMA: ("#gen-stats", "done"), BERT: ("#gen-stats", "encodes text but does not generate")},
}
# the walk: the page opens on Attention with the Llama; the model switches at every tab, Llama → BERT at the first.
# Patching and Generate switch from the Llama (the BERT's results there are an encoder's refusal); Generate is last,
# as the last tab is never hidden at a later switch and Generate has no first screen to compute again
WALK = ["Attention", "Positional encoding", "Heads", "Masks", "Patching", "Inside", "Generate"]
# results beyond a tab's first screen: (button, its note) run before the switch, whose note then says what to press
EXTRA = {"Heads": ("#heads-lens-run", "#heads-lens-note"), "Patching": ("#patch-dla-run", "#patch-dla-note"),
         "Inside": ("#inside-why-run", "#inside-why-note")}

# a cleared result whose button cannot run on the new model says why, not "press": the logit lens on the BERT,
# which has no language-model head
CLEARED = {("Heads", BERT): "this checkpoint has none"}

PANEL_TEXT = """() => {
  const panel = [...document.querySelectorAll('[role=tabpanel]')].find((p) => p.offsetParent !== null);
  const parts = [panel.innerText];
  for (const t of panel.querySelectorAll('.js-plotly-plot text')) {
    if (t.getBoundingClientRect().width > 0) parts.push(t.textContent);
  }
  return parts.join('\\n');
}"""
# a note's text once it is not empty and differs from `was` (what it said before its button was pressed)
NOTE_CHANGED = """([selector, was]) => {
  const text = (document.querySelector(selector)?.innerText || '').trim();
  return text !== '' && text !== was;
}"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("switch-models")
    llama = str(build_tiny_llama(root / LLAMA))
    bert = str(build_tiny_bert(root / BERT, layers=3, heads=8))
    demo, url, services = launch_app([llama, bert], llama)
    yield url, services, demo
    demo.close()


def open_tab(page: Page, label: str) -> None:
    page.get_by_role("tab", name=label, exact=True).click()


def choose(page: Page, model: str) -> None:
    page.locator("#model-picker input").click()
    page.get_by_role("option", name=re.compile(model)).click()


def shows(page: Page, label: str, model: str) -> None:
    """Until the tab on screen shows its result for `model`."""
    where, text = TABS[label][model]
    expect(page.locator(where)).to_contain_text(text, timeout=TIMEOUT_MS)


def show_results(page: Page, label: str, model: str) -> None:
    """The tab's results for the model loaded now on screen: its first screen, Generate's continuation, one more
    section (whose note may already hold a line from a switch: the run's own text is waited for)."""
    open_tab(page, label)
    if label == "Generate":  # a short continuation: each streamed token redraws the tab, 64 cost seconds
        tokens = page.locator("#gen-max-new input[type=number]")
        tokens.fill("8")
        tokens.press("Enter")
        expect(page.locator("#gen-max-new input[type=range]")).to_have_value("8")
        page.locator("#gen-run").click()
    shows(page, label, model)
    if label in EXTRA:
        button, note = EXTRA[label]
        was = page.locator(note).inner_text().strip()
        page.locator(button).click()
        page.wait_for_function(NOTE_CHANGED, arg=[note, was], timeout=TIMEOUT_MS)


def left(page: Page, label: str, model: str) -> list[str]:
    """What the tab on screen says of `model`: its OLD markers, and what the tab's own result for it says."""
    text = page.evaluate(PANEL_TEXT)
    return [marker for marker in [*OLD[model], TABS[label][model][1]] if marker in text]


def test_a_model_switch_leaves_nothing_of_the_old_model_in_any_tab(browser, served):
    url, *_ = served
    context, page, errors = open_page(browser, url)
    try:
        walked = None  # the tab walked before this one: it shows the old model's first screen, hidden at the switch
        for step, label in enumerate(WALK):
            old, new = (LLAMA, BERT) if step % 2 == 0 else (BERT, LLAMA)
            show_results(page, label, old)
            assert not left(page, label, new), f"{label} opened on {old} with {new}'s {left(page, label, new)}"
            assert left(page, label, old), f"{label}: the check reads the {old}'s results before the switch"
            if label == "Generate":
                assert page.locator("#gen-output textarea").input_value(), "a continuation to clear"
            choose(page, new)  # with this tab on screen
            shows(page, label, new)  # the switch came back
            if label in EXTRA:   # which button computes it for the new model, or why none can
                expect(page.locator(EXTRA[label][1])).to_contain_text(CLEARED.get((label, new), "press"),
                                                                      timeout=TIMEOUT_MS)
            settled(page)  # every figure redrawn: what is read below is the new model's
            assert not left(page, label, old), f"{label}: the {old}'s {left(page, label, old)} after the switch"
            assert left(page, label, new), f"{label}: the next check reads the {new}'s first screen here"
            if label == "Generate":
                assert page.locator("#gen-output textarea").input_value() == ""
            if walked is not None:  # hidden during the switch: it opens on the new model, nothing of the old
                open_tab(page, walked)
                shows(page, walked, new)
                settled(page)
                assert not left(page, walked, old), f"{walked}: the {old}'s {left(page, walked, old)} after a " \
                                                    f"switch with {label} on screen"
            walked = label
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
