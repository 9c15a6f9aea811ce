"""The Lab tab in a real browser (Debian's Chromium, headless, driven by Playwright): a tiny run trains and draws
its curves and snapshots, its attention is drawn, it is saved into the model picker, Stop ends a long run, and a
bad config is a message. Screenshots land in tests/screenshots/ (git-ignored)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SHOTS = Path(__file__).resolve().parent / "screenshots"
TIMEOUT_MS = 60_000

if not Path(CHROMIUM).is_file() or shutil.which(CHROMIUM) is None:
    pytest.skip(
        f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium), as .ci/run does",
        allow_module_level=True,
    )

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402

LAB_ENV = {"ATTN_LAB_EVAL_EXAMPLES": "16"}


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-lab")
    saved = {k: os.environ.get(k) for k in [*LAB_ENV, "ATTN_WEIGHTS_DIR"]}
    os.environ.update(LAB_ENV, ATTN_WEIGHTS_DIR=str(root / "weights"))
    llama = str(build_tiny_llama(root / "tiny-llama"))
    demo, url, _ = launch_app([llama], llama)
    yield url
    demo.close()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(app_url)
    expect(page.locator("#model-card table")).to_be_visible(timeout=TIMEOUT_MS)
    page.get_by_role("tab", name="Lab").click()
    yield page
    context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def tiny_config(page: Page, steps: int, snapshots: str = "") -> None:
    for elem_id, value in (("lab-layers", "1"), ("lab-d-model", "32"), ("lab-heads", "2"), ("lab-d-ff", "64"),
                           ("lab-steps", str(steps)), ("lab-lr", "0.003")):
        page.locator(f"#{elem_id} input").fill(value)
    page.locator("#lab-snapshot-steps textarea").fill(snapshots)


def expect_drawn(page: Page, elem_id: str, kind: str) -> None:
    layer = {"heatmap": ".hm image", "line": ".scatterlayer .trace"}[kind]
    expect(page.locator(f"#{elem_id} .js-plotly-plot {layer}").first).to_be_attached(timeout=TIMEOUT_MS)


def test_a_tiny_run_trains_draws_its_curves_and_attention_and_is_saved(page):
    tiny_config(page, 20, "10, 20")
    page.locator("#lab-train").click()
    expect(page.locator("#lab-status")).to_contain_text("done, step 20 / 20", timeout=TIMEOUT_MS)
    expect(page.locator("#lab-run-id textarea")).to_have_value("run1")
    expect_drawn(page, "lab-curves", "line")
    expect_drawn(page, "lab-snapshots", "heatmap")
    expect(page.locator("#lab-snapshots")).to_contain_text("step 20, layer 0")
    expect(page.locator("#lab-runs")).to_contain_text("run1", timeout=TIMEOUT_MS)
    expect(page.locator("#lab-pick input")).to_have_value("run1", timeout=TIMEOUT_MS)
    page.locator("#lab-attn-run").click()
    expect(page.locator("#lab-attn-note")).to_contain_text("answers", timeout=TIMEOUT_MS)
    for elem_id in ("lab-cross", "lab-encoder", "lab-decoder"):
        expect_drawn(page, elem_id, "heatmap")
    expect(page.locator("#lab-cross")).to_contain_text("layer 0, head 1")
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / "lab.png", full_page=True)
    page.locator("#lab-name textarea").fill("browser-run")
    page.locator("#lab-save").click()
    expect(page.locator("#lab-saved")).to_contain_text("Saved browser-run", timeout=TIMEOUT_MS)
    page.locator("#model-picker input").click()
    expect(page.get_by_role("option", name="browser-run", exact=True)).to_be_visible(timeout=TIMEOUT_MS)


def test_stop_ends_a_long_run_and_a_bad_config_is_a_message(page):
    tiny_config(page, 3000)
    page.locator("#lab-train").click()
    expect(page.locator("#lab-status")).to_contain_text("training, step", timeout=TIMEOUT_MS)
    page.locator("#lab-stop").click()
    status = page.locator("#lab-status")
    expect(status).to_contain_text(re.compile(r"stopped, step \d+ / 3000"), timeout=TIMEOUT_MS)
    expect(page.locator("#lab-runs")).to_contain_text("stopped", timeout=TIMEOUT_MS)  # set when the thread ends
    page.locator("#lab-heads input").fill("3")
    page.locator("#lab-train").click()
    expect(page.locator(".toast-body").first).to_contain_text("multiple of n_heads", timeout=TIMEOUT_MS)
    assert "Traceback" not in page.content()
