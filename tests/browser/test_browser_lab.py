"""The Lab tab in a real browser (Debian's Chromium, headless, driven by Playwright): its first screen holds the
Train button and no empty figure box, a tiny run trains and draws its curves and snapshots, its attention is drawn,
it is saved into the model picker, Stop ends a long run, and a bad config is a message. Screenshots land in
tests/screenshots/ (git-ignored)."""

from __future__ import annotations

import os
import re

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

TIMEOUT_MS = 60_000

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import Page, expect  # noqa: E402

from conftest import open_page, screenshot  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402

LAB_ENV = {"ATTN_LAB_EVAL_EXAMPLES": "16"}
FOLD_Y = 1000  # the bottom of a 1400 × 1000 window, in page coordinates, before any scrolling
NARROW = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-lab")
    with pytest.MonkeyPatch.context() as patch:  # the settings hold for the module, then go back
        for name, value in {**LAB_ENV, "ATTN_WEIGHTS_DIR": str(root / "weights")}.items():
            patch.setenv(name, value)
        llama = str(build_tiny_llama(root / "tiny-llama"))
        demo, url, _ = launch_app([llama], llama)
        yield demo, url
        demo.close()


@pytest.fixture(scope="module")
def app_url(app):
    return app[1]


@pytest.fixture(scope="module")
def lab_plots(app) -> list[str]:
    """The elem_id of every plot component of the Lab tab, read from the page's own config."""
    ids = [c["props"].get("elem_id") or "" for c in app[0].config["components"] if c.get("type") == "plot"]
    # the extrapolation figures show the shipped result from the start (tests/browser/test_browser_lab_extrapolation.py)
    # and so do the recurrence figures (the saved GRU-against-attention result, tests/ui/test_recurrence_view.py)
    # and the sinks figure (the saved softmax-against-learned-sink result, tests/app/test_app_lab_sinks.py)
    # and the induction circuit's (the saved run traced, in its folded section: the test below)
    lab = [i for i in ids if i.startswith("lab-") and not i.startswith(("lab-extra-", "lab-recurrence-", "lab-sinks-",
                                                                        "lab-induction-"))]
    assert len(lab) >= 5, ids  # curves, snapshots, cross, encoder, decoder
    return lab


def box(page: Page, selector: str) -> dict:
    """The element's box in page coordinates (not the window's, which move as the page scrolls)."""
    return page.locator(selector).first.evaluate(
        "(e) => { const r = e.getBoundingClientRect();"
        " return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}; }")


def expect_no_plot_shown(page: Page, plots: list[str]) -> None:
    for elem_id in plots:
        expect(page.locator(f"#{elem_id}")).to_be_hidden()


def open_settings(page: Page) -> None:
    """Unfold the closed section of secondary settings (model, training, snapshots), once."""
    if not page.locator("#lab-layers input").is_visible():
        page.locator("#lab-settings > button, #lab-settings .label-wrap").first.click()
        expect(page.locator("#lab-layers input")).to_be_visible()


@pytest.fixture
def page(page):
    """The shared page (tests/conftest.py), on the Lab tab."""
    page.get_by_role("tab", name="Lab").click()
    return page


def tiny_config(page: Page, steps: int, snapshots: str = "") -> None:
    open_settings(page)
    for elem_id, value in (("lab-layers", "1"), ("lab-d-model", "32"), ("lab-heads", "2"), ("lab-d-ff", "64"),
                           ("lab-steps", str(steps)), ("lab-lr", "0.003")):
        page.locator(f"#{elem_id} input").fill(value)
    page.locator("#lab-snapshot-steps textarea").fill(snapshots)


def expect_drawn(page: Page, elem_id: str, kind: str) -> None:
    layer = {"heatmap": ".hm image", "line": ".scatterlayer .trace"}[kind]
    expect(page.locator(f"#{elem_id} .js-plotly-plot {layer}").first).to_be_attached(timeout=TIMEOUT_MS)


def test_the_first_screen_holds_the_train_button_and_no_empty_figure(page, lab_plots):
    train = box(page, "#lab-train")
    assert train["height"] > 0 and train["y"] + train["height"] <= FOLD_Y, train
    for elem_id in ("lab-task", "lab-steps", "lab-stop"):
        assert box(page, f"#{elem_id}")["y"] < FOLD_Y, elem_id
    expect_no_plot_shown(page, lab_plots)
    screenshot(page, "lab-wide")
    open_settings(page)
    page.locator("#lab-heads input").fill("3")  # d_model 128 is no multiple of 3
    page.locator("#lab-train").click()
    expect(page.locator(".toast-body").first).to_contain_text("multiple of n_heads", timeout=TIMEOUT_MS)
    expect_no_plot_shown(page, lab_plots)  # a bad config opens no figure box


def test_the_narrow_screen_opens_on_the_controls_and_no_empty_figure(browser, app_url, lab_plots):
    # a narrow screen folds the tab bar into a menu; the link opens the tab
    context, page, errors = open_page(browser, f"{app_url}?tab=lab", NARROW)
    try:
        expect(page.locator("#lab-train")).to_be_visible(timeout=TIMEOUT_MS)
        expect_no_plot_shown(page, lab_plots)
        assert box(page, "#lab-train")["y"] < box(page, "#lab-status")["y"]  # controls above the results
        screenshot(page, "lab-narrow")
    finally:
        context.close()
    assert not errors, errors


def test_a_tiny_run_trains_draws_its_curves_and_attention_and_is_saved(page):
    tiny_config(page, 20, "10, 20")
    page.locator("#lab-train").click()
    expect(page.locator("#lab-curves")).to_be_visible(timeout=TIMEOUT_MS)  # shown as the stream starts
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
    screenshot(page, "lab")
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


def test_the_induction_section_draws_the_saved_runs_circuit_inside_the_page(page):
    """Unfolded, the section shows the saved run traced (core.lab.induction, tests/core/test_induction.py): its
    words, the two heads' maps and the bars of what feeds the induction head's keys, each within the page. Last in
    the module: once drawn, its figures stay mounted, and during a training stream on a loaded machine the page's
    longest tasks then grow (measured with a longtask observer under two busy cores: up to 0.64 s against 0.45 s),
    which the Stop test's click must not wait behind."""
    section = page.locator("#lab-induction > button, #lab-induction .label-wrap").first
    section.click()
    expect(page.locator("#lab-induction-note")).to_contain_text("the circuit Olsson et al. (2022) describe",
                                                                timeout=TIMEOUT_MS)
    expect_drawn(page, "lab-induction-heads", "heatmap")
    expect(page.locator("#lab-induction-feeds .js-plotly-plot .barlayer .point").first).to_be_attached()
    width = page.evaluate("document.documentElement.clientWidth")
    for elem_id in ("lab-induction-heads", "lab-induction-feeds"):
        figure = box(page, f"#{elem_id} .js-plotly-plot")
        assert figure["width"] > 200 and figure["x"] >= 0 and figure["x"] + figure["width"] <= width + 1, figure
    section.click()   # folded again: the shared page goes on as it came
