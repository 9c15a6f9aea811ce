"""The Learn tab in headless Chromium on the tiny Llama: before Reveal the page (the lesson's panel, the line under
the figure, the figure's title, subtitle and every text it draws) does not state the measured answer as the
page formats it; Reveal shows it beside the guess, with the figure's line. And "Try it" from a lesson that opens
the Inside tab lands there computed: its figures drawn, none reading "Error"."""

from __future__ import annotations

import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from conftest import idle, open_page  # noqa: E402
from ui.services import learn  # noqa: E402
from ui.services.learn import course as syllabus  # noqa: E402

TIMEOUT_MS = 60_000
READ = """() => [document.querySelector('#learn-lesson'), document.querySelector('#learn-alt'),
                 document.querySelector('#learn-figure')].map((el) => el ? el.innerText + ' ' +
                 [...el.querySelectorAll('svg text')].map((t) => t.textContent).join(' ') : '').join('\\n')"""


@pytest.fixture(scope="module")
def app_url(tiny_llama_app):
    return tiny_llama_app


@pytest.mark.parametrize("name", ["heads", "kv-cache"])
def test_the_page_holds_the_answer_back_until_reveal(browser, app_url, name):
    url, services, llama = app_url
    lesson = syllabus.find(name)
    measured = services.lessons.get(services.models.key(llama), services.models.get(llama), lesson)
    shown = learn.number(measured.answer)
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson={name}")
    try:
        expect(page.locator("#learn-place")).to_contain_text(lesson.title, timeout=TIMEOUT_MS)
        expect(page.locator("#learn-figure .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
        idle(page, TIMEOUT_MS)  # every opening event has run: nothing the page writes later goes unread
        before = page.evaluate(READ)
        assert lesson.question.prompt in before
        assert shown not in before and measured.alt not in before, before
        page.locator("#learn-guess-number input, #learn-guess-number textarea").first.fill("7")
        page.locator("#learn-reveal").click()
        expect(page.locator("#learn-answer")).to_contain_text(f"measured: {shown}", timeout=TIMEOUT_MS)
        expect(page.locator("#learn-answer")).to_contain_text("Your guess: 7")
        expect(page.locator("#learn-alt")).to_contain_text(measured.alt[:40], timeout=TIMEOUT_MS)
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def test_try_it_from_a_lesson_lands_on_a_computed_inside_tab(browser, app_url):
    url, _, _ = app_url
    lesson = syllabus.find("sqrt-dk")
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson={lesson.name}")
    try:
        expect(page.locator("#learn-place")).to_contain_text(lesson.title, timeout=TIMEOUT_MS)
        expect(page.locator("#learn-try")).to_contain_text("Inside")
        page.locator("#learn-try").click()
        expect(page.get_by_role("tab", name="Inside")).to_have_attribute("aria-selected", "true",
                                                                        timeout=TIMEOUT_MS)
        expect(page.locator("#inside-note")).to_contain_text("layer", timeout=TIMEOUT_MS)
        # the figures on screen are drawn with data, and none is Gradio's error box
        page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot')]
            .some((gd) => gd.offsetParent !== null && gd.data && gd.data.length > 0)""", timeout=TIMEOUT_MS)
        errors_shown = page.evaluate("""() => [...document.querySelectorAll('.error, [class*=error]')]
            .filter((e) => e.offsetParent !== null && /Error/.test(e.innerText)).length""")
        assert errors_shown == 0
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def test_a_link_to_a_lesson_computes_the_other_tabs_only_when_they_are_opened(browser, app_url):
    """The Attention tab is selected as the page mounts, before the link moves the page to Learn: its first screen
    waits until its user opens it, and so does every other tab's, each computed then."""
    url, _, _ = app_url
    context, page, errors = open_page(browser, f"{url}?tab=learn&lesson=heads")
    try:
        expect(page.locator("#learn-place")).to_contain_text(syllabus.find("heads").title, timeout=TIMEOUT_MS)
        idle(page, TIMEOUT_MS)
        assert page.evaluate("() => document.querySelector('#attn-note').innerText.trim()") == ""
        page.get_by_role("tab", name="Attention", exact=True).click()
        expect(page.locator("#attn-note")).to_contain_text("layer", timeout=TIMEOUT_MS)
        expect(page.locator("#attn-head-view .js-plotly-plot .main-svg").first).to_be_attached(timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Masks", exact=True).click()
        expect(page.locator("#mask-stage-on-scores .js-plotly-plot .main-svg").first).to_be_attached(
            timeout=TIMEOUT_MS)
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"
