"""The Learn tab in headless Chromium on the real SmolLM2: at 1400 × 1000 every lesson, in order with Next, shows
its figure and the figure's line; Reveal adds the answer to the lesson's panel, and the number it shows is the one
the lesson's measurement gave for the same model (the server's, as the page asked for it). On a 390 px
phone every lesson's panel and figure fit the width (the layout only: the answers are the same numbers). A link
opens a lesson by name; the browser remembers the lesson and what was revealed; the keyboard reaches and presses the
buttons; "try it" lands on the lesson's tab with its state."""

from __future__ import annotations

import os
import re

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import SMOLLM, open_page, screenshot, settled  # noqa: E402
from tiny_app_model import launch_app  # noqa: E402
from ui.services import learn  # noqa: E402
from ui.services.learn import course as syllabus  # noqa: E402
from ui.tabs.learn.course import SAVED_KEY  # noqa: E402

TIMEOUT_MS = 60_000
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def served(smollm_folder):
    demo, url, services = launch_app([SMOLLM], SMOLLM)
    yield url, services
    demo.close()


@pytest.fixture(scope="module")
def encoder_installed():
    """MiniLM in the weight store, for the model change (the picker would fetch it, with a bar, mid-test)."""
    from core.store import WeightsUnavailable, ensure

    try:
        ensure("minilm-l6")
    except WeightsUnavailable as error:
        pytest.skip(f"minilm-l6: no weight source reachable, so the model change cannot be tried:\n{error}")


def shown_answer(services, lesson) -> str:
    """The lesson's answer as the page shows it, from the measurement the server made for this page (its lesson
    cache, filled by the walk: the services' own numbers are checked against their definitions in
    tests/ui/test_learn_*.py; this checks that the page shows that measurement's answer, formatted as it is)."""
    model = services.models.get(SMOLLM)
    return learn.number(services.lessons.get(SMOLLM, model, lesson).answer)


def guess(page, lesson: learn.Lesson) -> None:
    if lesson.question.choices:
        page.locator("#learn-guess-choice label").first.click()
    else:
        page.locator("#learn-guess-number input, #learn-guess-number textarea").first.fill("1")


def test_every_lesson_shows_its_figure_and_its_measured_answer(browser, served):
    url, services = served
    lessons = syllabus.lessons()
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson={lessons[0].name}")
    try:
        for number, lesson in enumerate(lessons, start=1):
            expect(page.locator("#learn-place")).to_contain_text(f"Lesson {number} of {len(lessons)}",
                                                                 timeout=TIMEOUT_MS)
            expect(page.locator("#learn-place")).to_contain_text(lesson.title)
            expect(page.locator("#learn-figure .js-plotly-plot")).to_be_attached(timeout=TIMEOUT_MS)
            expect(page.locator("#learn-alt")).not_to_be_empty()
            assert page.locator("#learn-figure .js-plotly-plot .main-svg").count() > 0
            expect(page.locator("#learn-answer")).to_be_empty()
            guess(page, lesson)
            page.locator("#learn-reveal").click()
            answer = page.locator("#learn-lesson #learn-answer")
            expect(answer).to_contain_text("Why:", timeout=TIMEOUT_MS)
            expect(answer).to_contain_text("Your guess")
            # the measured number (or choice), as the lesson's measurement gave it
            number_shown = shown_answer(services, lesson)
            shown = f"“{number_shown}”" if lesson.question.choices else number_shown
            expect(answer).to_contain_text(f"measured: {shown}")
            if number < len(lessons):
                page.locator("#learn-next").click()
        screenshot(page, "learn-wide")
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def inside_the_phone(page, selector: str) -> None:
    box, width = page.locator(selector).first.bounding_box(), PHONE["width"]
    assert box["width"] > 0 and box["x"] >= -1 and box["x"] + box["width"] <= width + 1, (selector, box, width)


def test_on_a_phone_every_lessons_panel_and_figure_fit_the_width(browser, served):
    url, _ = served
    lessons = syllabus.lessons()
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson={lessons[0].name}", PHONE)
    try:
        for number, lesson in enumerate(lessons, start=1):
            expect(page.locator("#learn-place")).to_contain_text(f"Lesson {number} of {len(lessons)}",
                                                                 timeout=TIMEOUT_MS)
            expect(page.locator("#learn-place")).to_contain_text(lesson.title)
            expect(page.locator("#learn-figure .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
            settled(page)
            for selector in ("#learn-lesson", "#learn-reveal", "#learn-figure .js-plotly-plot"):
                inside_the_phone(page, selector)
            # one column: the figure comes under the lesson's panel, not beside it
            figure, panel = page.locator("#learn-figure").bounding_box(), page.locator("#learn-lesson").bounding_box()
            assert figure["y"] >= panel["y"] + panel["height"] - 1, (figure, panel)
            if number < len(lessons):
                page.locator("#learn-next").click()
        screenshot(page, "learn-phone")
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def test_a_link_opens_a_lesson_the_browser_remembers_it_and_the_keyboard_walks_on(browser, served, encoder_installed):
    url, _ = served
    third, fourth = syllabus.lessons()[2:4]
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson={third.name}")
    try:
        expect(page.locator("#learn-place")).to_contain_text("Lesson 3 of", timeout=TIMEOUT_MS)
        expect(page.locator("#learn-place")).to_contain_text(third.title)
        # the browser's copy of the progress (BrowserState, encrypted in localStorage): count what is written
        page.evaluate("""(key) => {
            window.__saved = 0;
            const set = Storage.prototype.setItem;
            Storage.prototype.setItem = function (k, v) {
                if (k === key) window.__saved++;
                return set.call(this, k, v);
            }; }""", SAVED_KEY)
        page.locator("#learn-reveal").focus()    # the reveal, pressed from the keyboard
        page.keyboard.press("Enter")
        expect(page.locator("#learn-answer")).to_contain_text("Measured", timeout=TIMEOUT_MS)
        # the reveal's own outputs: the picker marks the lesson, and its progress is written to the browser
        expect(page.locator("#learn-choose input")).to_have_value(f"3. {third.title} ✓", timeout=TIMEOUT_MS)
        page.wait_for_function("() => window.__saved > 0", timeout=TIMEOUT_MS)
        page.goto(url)               # no query: the page opens on its own tab; the Learn tab resumes at lesson 3
        expect(page.locator("#model-picker")).to_be_visible(timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Learn").click()
        expect(page.locator("#learn-place")).to_contain_text(third.title, timeout=TIMEOUT_MS)
        expect(page.locator("#learn-choose input")).to_have_value(f"3. {third.title} ✓")   # revealed, marked
        # from the lesson picker, Tab reaches Back, then Next; Enter on Next opens lesson 4
        page.locator("#learn-choose input").focus()
        for target in ("learn-back", "learn-next"):
            for _ in range(6):
                page.keyboard.press("Tab")
                if page.evaluate("() => document.activeElement.closest('[id]')?.id") == target:
                    break
            assert page.evaluate("() => document.activeElement.closest('[id]')?.id") == target, target
        page.keyboard.press("Enter")
        expect(page.locator("#learn-place")).to_contain_text("Lesson 4 of", timeout=TIMEOUT_MS)
        expect(page.locator("#learn-place")).to_contain_text(fourth.title)
        # a model change mid-lesson computes the lesson for the new model, in place
        page.locator("#model-picker input").click()
        page.get_by_role("option", name=re.compile("^minilm-l6")).click()
        expect(page.locator("#learn-text")).to_contain_text("Measured on minilm-l6", timeout=TIMEOUT_MS)
        expect(page.locator("#learn-place")).to_contain_text(fourth.title)
        expect(page.locator("#learn-answer")).to_be_empty()
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def test_try_it_opens_the_lessons_tab_in_its_state(browser, served):
    url, services = served
    model = services.models.get(SMOLLM)
    lesson = syllabus.find("sqrt-dk")
    link = services.lessons.get(SMOLLM, model, lesson).link
    assert link["tab"] == "inside" and {"layer", "head", "text"} <= set(link)
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson={lesson.name}")
    try:
        expect(page.locator("#learn-place")).to_contain_text(lesson.title, timeout=TIMEOUT_MS)
        expect(page.locator("#learn-try")).to_contain_text("Inside")
        page.locator("#learn-try").click()
        expect(page.get_by_role("tab", name="Inside")).to_have_attribute("aria-selected", "true",
                                                                        timeout=TIMEOUT_MS)
        expect(page.locator("#inside-layer input")).to_have_value(str(link["layer"]), timeout=TIMEOUT_MS)
        expect(page.locator("#inside-text textarea")).to_have_value(link["text"])
        # the walk is computed for that layer and head on that text
        expect(page.locator("#inside-note")).to_contain_text(f"layer {link['layer']}", timeout=TIMEOUT_MS)
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"
