"""The Generate tab's step view in Chromium (the shared browser fixtures of conftest.py): picking a token in the
strip shows that token's row, a second generation clears the old step, the trace downloads as JSON, with an
encoder loaded Generate is off and says why, and Stop ends a long generation at once (the strip fills after it,
not on every token)."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from conftest import PAGE_TIMEOUT_MS, screenshot  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-generate")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    demo, url, services = launch_app([llama, bert], llama)
    yield url, services.models.get(llama)
    demo.close()


@pytest.fixture(scope="module")
def app_url(served):
    return served[0]


@pytest.fixture
def page(shared_page):
    """One page walked by the module's tests in order (tests/conftest.py); the switch to the encoder comes last."""
    return shared_page


def generate(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Generate").click()
    page.locator("#gen-chat input").uncheck()
    slider = page.locator("#gen-max-new input[type=number]")
    slider.fill(str(NEW_TOKENS))
    slider.press("Enter")
    return run_to_the_end(page)


def run_to_the_end(page):
    """Generate, and wait for this run's own end: the page still shows the previous test's run ("done" and a full
    strip), so first the old strip's labels go (a run clears the strip as it starts), then the new strip fills
    (once, as the run's last update), then "done"."""
    from playwright.sync_api import expect

    strip = page.locator("#gen-strip label")
    old = strip.first.element_handle() if strip.count() else None
    page.locator("#gen-run").click()
    if old is not None:
        page.wait_for_function("(label) => !label.isConnected", arg=old, timeout=PAGE_TIMEOUT_MS)
    expect(strip).to_have_count(NEW_TOKENS, timeout=PAGE_TIMEOUT_MS)
    expect(page.locator("#gen-stats")).to_contain_text("done", timeout=PAGE_TIMEOUT_MS)
    return strip


def test_picking_a_token_in_the_strip_shows_its_attention_row(page):
    from playwright.sync_api import expect

    strip = generate(page)
    strip.nth(2).click()
    expect(page.locator("#gen-step input")).to_have_value("2", timeout=PAGE_TIMEOUT_MS)
    note = page.locator("#gen-step-note")
    expect(note).to_contain_text("Step 2", timeout=PAGE_TIMEOUT_MS)
    expect(page.locator("#gen-step-row .js-plotly-plot .barlayer .trace").first).to_be_attached(
        timeout=PAGE_TIMEOUT_MS)
    expect(page.locator("#gen-step-overview .js-plotly-plot .hm image").first).to_be_attached(timeout=PAGE_TIMEOUT_MS)
    shaded = page.locator("#gen-step-text .gen-shade")
    expect(shaded.locator(".tok.current")).to_have_count(1)
    context_at_2 = shaded.locator("[data-weight]").count()
    current_2 = shaded.locator(".tok.current").get_attribute("data-pos")
    screenshot(page, "generate-step")
    # another token: the note, the outlined token and the shaded context move to its row
    strip.nth(6).click()
    expect(note).to_contain_text("Step 6", timeout=PAGE_TIMEOUT_MS)
    expect(shaded.locator("[data-weight]")).to_have_count(context_at_2 + 4, timeout=PAGE_TIMEOUT_MS)
    assert int(shaded.locator(".tok.current").get_attribute("data-pos")) == int(current_2) + 4


def test_the_trace_downloads_as_json(page):
    strip = generate(page)
    labels = strip.all_inner_texts()
    page.get_by_text("This step's numbers, the whole trace, the download").click()
    page.locator("#gen-export").click()
    link = page.locator("#gen-export-file a").first
    link.wait_for(timeout=PAGE_TIMEOUT_MS)
    with page.expect_download(timeout=PAGE_TIMEOUT_MS) as info:
        link.click()
    data = json.loads(open(info.value.path(), encoding="utf-8").read())
    assert data["n_tokens"] == NEW_TOKENS and [s["token"] for s in data["steps"]] == [label.strip() for label in labels]
    assert all(len(s["top"]) == 10 and s["rank"] >= 1 for s in data["steps"])
    attention = data["attention"]
    assert attention["layout"] == "per head" and len(attention["self"]) == NEW_TOKENS
    assert len(attention["self"][0][0][0]) == len(data["context_tokens"])  # step 0 reads the prompt


def test_a_second_generation_clears_the_old_step(page):
    from playwright.sync_api import expect

    strip = generate(page)
    strip.nth(3).click()
    note = page.locator("#gen-step-note")
    expect(note).to_contain_text("Step 3", timeout=PAGE_TIMEOUT_MS)
    run_to_the_end(page)
    expect(note).not_to_contain_text("Step 3")
    expect(page.locator("#gen-step-row .js-plotly-plot")).to_have_count(0)


def written(stats: str) -> int:
    """The token count of the stats line ("**37** tokens in …")."""
    return int(re.search(r"(\d+)\s+tokens in", stats).group(1))


def test_stop_ends_a_long_generation_and_the_strip_fills_once_after_it(page, served, monkeypatch):
    from playwright.sync_api import expect

    # the tiny model writes 512 tokens in about a second, faster than a click; pace it like a real model, and let
    # it write to the end of its context whatever the page asked for, so that only Stop can end the stream before
    # the page is answered: what ended it is then read from the stream itself, not from the time it took
    model = served[1]
    real_stream = model.stream
    pulled, closed, budget = [0], threading.Event(), []

    def paced_stream(input_ids, max_new_tokens, **options):
        budget.append(model.config.max_positions - input_ids.shape[1])
        try:
            for token in real_stream(input_ids, budget[-1], **options):
                time.sleep(0.02)
                pulled[0] += 1
                yield token
        finally:
            closed.set()

    monkeypatch.setattr(model, "stream", paced_stream)
    page.get_by_role("tab", name="Generate").click()
    page.locator("#gen-chat input").uncheck()
    slider = page.locator("#gen-max-new input[type=number]")
    slider.fill("512")
    slider.press("Enter")
    page.locator("#gen-run").click()
    stats, strip = page.locator("#gen-stats"), page.locator("#gen-strip label")
    # once the page has been sent 20 tokens, the strip is still empty: it is not redrawn per token
    page.wait_for_function("() => /(\\d+)\\s+tokens in/.test(document.querySelector('#gen-stats').innerText) && "
                           "Number(/(\\d+)\\s+tokens in/.exec(document.querySelector('#gen-stats').innerText)[1]) >= 20",
                           timeout=PAGE_TIMEOUT_MS)
    assert "writing" in stats.inner_text() and strip.count() == 0, "the strip was filled while the model wrote"
    page.locator("#gen-stop").click()  # Playwright's own 30 s: a page that keeps up answers at once
    expect(stats).to_contain_text("stopped", timeout=PAGE_TIMEOUT_MS)
    assert closed.wait(PAGE_TIMEOUT_MS / 1000), "Stop left the model's stream open"
    assert pulled[0] < budget[0], f"the stream ran to its end ({pulled[0]} tokens) before Stop ended it"
    # the Stop handler fills the strip with the tokens of the session's trace
    expect(strip.first).to_be_attached(timeout=PAGE_TIMEOUT_MS)
    n = strip.count()
    # at least the tokens the page shows: updates still on their way when Stop cancels the stream reach the
    # session's trace, not the page
    assert 20 <= written(stats.inner_text()) <= n <= pulled[0]
    text = page.locator("#gen-output textarea").input_value()
    # a round trip through the queue (the step view of the first token) comes back; the text has not grown
    strip.first.click()
    expect(page.locator("#gen-step-note")).to_contain_text("Step 0", timeout=PAGE_TIMEOUT_MS)
    assert page.locator("#gen-output textarea").input_value() == text, "text kept growing after Stop"
    assert "stopped" in stats.inner_text() and "done" not in stats.inner_text() and strip.count() == n


def test_generate_is_off_with_an_encoder_loaded_and_says_why(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Generate").click()
    expect(page.locator("#gen-run")).to_be_enabled()
    picker = page.locator("#model-picker input")
    picker.click()
    page.get_by_role("option", name="tiny-bert", exact=False).first.click()
    expect(page.locator("#gen-run")).to_be_disabled(timeout=PAGE_TIMEOUT_MS)
    expect(page.locator("#gen-cannot")).to_contain_text("is an encoder", timeout=PAGE_TIMEOUT_MS)
