"""The Learn tab in headless Chromium on the real SmolLM2 and MiniLM (an encoder). At 1400 × 1000, every lesson in
order with Next, on each model: before Reveal the tab's whole text and every string of the figure as the page holds
it (title, subtitle, annotations, names, hover, text on the marks) state neither the measured answer (as the page
formats it) nor the figure's line, and plotly's own data of every figure shown (each trace's x, y, z and values,
and its axes' ranges) holds no trace that Reveal draws and no number that states the answer (as a value or a share
× 100, to the precision the answer shows); Reveal shows the answer beside the guess, as the server's measurement
for this page gave it, the measured figure with a numeric guess marked on it, and the line; "Try it" opens the
lesson's tab on its text and computes there (every figure with data or a note saying why, nothing reading Error),
the figure the lesson names as its subject among them, drawn with data (both models). On a 390 px phone every
lesson's panel and revealed figure fit the width, and the figure's title, subtitle, plot, legend and axis labels
keep apart; plotly's toolbar covers no title, no two titles overlap, neighbouring bars' values keep apart, and the
lesson picker shows its name whole with its caret beside it. A link opens a lesson by name; the browser remembers
the lesson and what was revealed; the keyboard reaches and presses the buttons."""

from __future__ import annotations

import json
import os
import re
from urllib.parse import quote

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")
from playwright.sync_api import expect  # noqa: E402

from learn_checks import carries  # noqa: E402
from conftest import SMOLLM, WIDE, idle, open_page, runs_done, screenshot, settled, wait_for_run  # noqa: E402
from tiny_app_model import launch_app  # noqa: E402
from ui.services import learn  # noqa: E402
from ui.services.learn import course as syllabus  # noqa: E402
from ui.tabs.learn.course import SAVED_KEY, short_title  # noqa: E402
from ui.views.learn import course as views  # noqa: E402
from ui.views.learn.setup import GUESS  # noqa: E402

TIMEOUT_MS = 60_000
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def served(smollm_folder):
    """The app on SmolLM2, its lessons' timings run once each on fewer tokens: what is checked here is that the page
    shows the server's own measurement, whatever it timed (the timings are checked in tests/ui/test_learn_*)."""
    from ui.services.learn import attention, generation

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "TIMING_RUNS", 1)
        patch.setattr(attention, "MAX_READ_TOKENS", 12)
        patch.setattr(generation, "COST_REPEATS", 1)
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


def measured(services, model_name: str, lesson):
    """The lesson as the server measured it for this page (its lesson cache, filled as the page asked for it; the
    services' own numbers are checked against their definitions in tests/ui/test_learn_*.py): this checks that the
    page shows that measurement, formatted as it is."""
    return services.lessons.get(services.models.key(model_name), services.models.get(model_name), lesson)


def guess(page, lesson: learn.Lesson) -> None:
    if lesson.question.choices:
        page.locator("#learn-guess-choice label").first.click()
    else:
        page.locator("#learn-guess-number input, #learn-guess-number textarea").first.fill("1")


# before Reveal: the Learn tab's whole text, every string of its figure as the page holds it (titles, subtitle,
# annotations, names, hover templates, text on the marks) and every text the figure draws
HELD_BACK = """() => {
  const panel = document.querySelector('#learn-lesson').closest('[role=tabpanel]');
  const gd = document.querySelector('#learn-figure .js-plotly-plot');
  const strings = (v, out, depth) => {
    if (typeof v === 'string') out.push(v);
    else if (v && typeof v === 'object' && depth < 12) Object.values(v).forEach((x) => strings(x, out, depth + 1));
    return out; };
  const held = gd && gd.offsetParent !== null ? strings([gd.data, gd.layout], [], 0) : [];
  const drawn = gd && gd.offsetParent !== null ? [...gd.querySelectorAll('svg text')].map((t) => t.textContent) : [];
  return [panel.innerText, ...held, ...drawn].join('\\n'); }"""

# plotly's own data of every figure shown in the Learn tab: each its title (ui.plots.base.fit_narrow's annotation),
# its traces' names, x, y, z and values (typed arrays as lists), and its axes' ranges
FIGURES = """() => {
  const panel = document.querySelector('#learn-lesson').closest('[role=tabpanel]');
  const plain = (v) => (v == null ? null : ArrayBuffer.isView(v) ? Array.from(v)
      : Array.isArray(v) ? v.map(plain) : v);
  return [...panel.querySelectorAll('.js-plotly-plot')].filter((gd) => gd.offsetParent !== null && gd._fullLayout)
    .map((gd) => ({
      title: ((gd.layout.annotations || []).find((a) => a.name === 'title') || {}).text || null,
      traces: (gd._fullData || []).map((t) => ({name: t.name, x: plain(t.x), y: plain(t.y), z: plain(t.z),
                                                 values: plain(t.values)})),
      ranges: Object.keys(gd._fullLayout).filter((k) => /^[xy]axis\\d*$/.test(k))
        .map((k) => gd._fullLayout[k].range || [])})); }"""

# the figures shown are (title, number of traces) as expected: the page has drawn what the server sent
DRAWN = "(expected) => JSON.stringify((" + FIGURES + ")().map((f) => [f.title, f.traces.length])) === " \
        "JSON.stringify(expected)"

# the target tab after a landing: its figures shown (each with data, or a note in words), and what reads "Error"
LANDED = """() => {
  const panel = [...document.querySelectorAll('[role=tabpanel]')].find((p) => p.offsetParent !== null
      && !p.querySelector('#learn-lesson'));
  const shown = [...panel.querySelectorAll('.js-plotly-plot')].filter((gd) => gd.offsetParent !== null);
  const figures = shown.map((gd) => [gd.closest('[id]')?.id, (gd.data || []).length,
      ((gd.layout || {}).annotations || []).filter((a) => a.text).length]);
  const errors = [...document.querySelectorAll('.error, [class*=error], .toast-body')]
      .filter((e) => e.offsetParent !== null && /Error/.test(e.innerText)).map((e) => e.innerText.slice(0, 200));
  return {figures, errors, text: panel.innerText}; }"""


# the figure a lesson's Try it names (its elem_id): plotly has drawn it with a trace that holds data
SUBJECT = """(id) => { const gd = document.querySelector(`#${id} .js-plotly-plot`);
  const filled = (v) => v != null && (ArrayBuffer.isView(v) || Array.isArray(v)) && v.length > 0;
  return !!gd && gd.offsetParent !== null && (gd._fullData || []).some((t) =>
      [t.x, t.y, t.z, t.values].some(filled)); }"""


def plain(markdown: str) -> str:
    """A line of the lesson's Markdown as the page shows its words (emphasis and code marks dropped)."""
    return re.sub(r"\\(?=[_*`])|[*`]", "", markdown)


def title_of(figure) -> str | None:
    """The figure's title as the page holds it (ui.plots.base.fit_narrow sets it as an annotation named "title")."""
    return next((a.text for a in figure.layout.annotations if a.name == "title"), None)


def drawn(page, figure) -> list[dict]:
    """Plotly's own data of the figures shown, once the page shows `figure` (None: no figure shown)."""
    expected = [] if figure is None else [[title_of(figure), len(figure.data)]]
    page.wait_for_function(DRAWN, arg=expected, timeout=TIMEOUT_MS)
    return page.evaluate(FIGURES)


def key(trace: dict) -> str:
    return json.dumps([trace[part] for part in ("x", "y", "z", "values")])


def held_back(page, lesson: learn.Lesson, result) -> list[dict]:
    """The page states neither the measured answer (as the page formats it) nor the figure's line, and shows only
    the lesson's set-up figure (ui.views.learn.setup), whose plotly data states no answer; returns that data."""
    before = drawn(page, views.before_reveal(lesson.name, result))
    page_text = page.evaluate(HELD_BACK)
    assert lesson.question.prompt in page_text
    assert plain(result.alt)[:60] not in page_text, lesson.name
    if lesson.question.numeric and not isinstance(result.answer, str):
        shown = learn.number(result.answer)
        if len(shown) == 1 and lesson.question.unit:   # one digit is in every tick label: the page states it with
            # its unit (0 % sink heads, say)
            assert f"{shown} {lesson.question.unit}" not in page_text, (lesson.name, shown)
            assert f"{shown}{lesson.question.unit}" not in page_text, (lesson.name, shown)
        else:
            assert shown not in page_text, (lesson.name, shown)
        for figure in before:
            assert not carries(figure["ranges"], result.answer), (lesson.name, figure["ranges"])
            for trace in figure["traces"]:
                assert not carries([trace[p] for p in ("x", "y", "z", "values")], result.answer), lesson.name
    return before


def revealed(page, lesson: learn.Lesson, result, before: list[dict]) -> None:
    """Reveal: the answer beside the guess, the measured figure with a numeric guess marked on it, and its line;
    no trace drawn before Reveal is one drawn now."""
    guess(page, lesson)
    page.locator("#learn-reveal").click()
    answer = page.locator("#learn-lesson #learn-answer")
    expect(answer).to_contain_text("Why:", timeout=TIMEOUT_MS)
    if lesson.question.numeric and not isinstance(result.answer, str):
        expect(answer).to_contain_text(f"measured: {learn.number(result.answer)}")
        expect(answer).to_contain_text("Your guess: 1")
    elif lesson.question.choices and result.answer in lesson.question.choices:
        expect(answer).to_contain_text(f"measured: “{result.answer}”")
        expect(answer).to_contain_text("Your guess")
    else:   # nothing to measure on this model: the answer says what, and why
        expect(answer).to_contain_text(str(result.answer))
    expected = views.figure(lesson.name, result, learn.read_guess(lesson.question, "1")[0] if
                            lesson.question.numeric else None)
    after = drawn(page, expected)
    after_keys = {key(trace) for figure in after for trace in figure["traces"]}
    for figure in before:
        for trace in figure["traces"]:
            assert key(trace) not in after_keys, (lesson.name, trace["name"])
    marked = any(trace["name"] == GUESS for figure in after for trace in figure["traces"])
    assert marked == any(trace.name == GUESS for trace in expected.data), lesson.name
    if expected.data:   # a figure with values: its line comes with the answer
        expect(page.locator("#learn-alt")).to_contain_text(plain(result.alt)[:60], timeout=TIMEOUT_MS)


def landed(page, lesson: learn.Lesson, result) -> None:
    """Try it: the lesson's tab opens with the lesson's text and settings, and its landing computes there."""
    state = views.try_state(result.link)
    title = views.TAB_TITLES[state["tab"]]
    before = runs_done(page, "learn-try")
    page.locator("#learn-try").click()
    expect(page.get_by_role("tab", name=title, exact=True)).to_have_attribute("aria-selected", "true",
                                                                            timeout=TIMEOUT_MS)
    wait_for_run(page, "learn-try", before)
    idle(page)
    for key, elem_id in FIELD_IDS.items():
        if key[0] == state["tab"] and key[1] in state and key[1] in ("text", "corrupted"):
            expect(page.locator(f"#{elem_id} textarea")).to_have_value(state[key[1]])
    shown = page.evaluate(LANDED)
    assert not shown["errors"], (lesson.name, title, shown["errors"])
    if state.get("compute") is False:   # a model the tab cannot run: it opens, and the lesson's note says why
        assert result.note, lesson.name
        return
    if state["tab"] == "generate":   # written on from the lesson's text, its tokens in the strip
        assert page.locator("#gen-output textarea").input_value().strip(), lesson.name
        expect(page.locator("#gen-strip label").first).to_be_attached()
        return
    # a figure with data; only where the lesson itself says this model cannot run it (its note) may the tab say so
    # too, in a note in place of its figure (an encoder's Patching tab)
    assert any(data for _, data, _ in shown["figures"]) or result.note, (lesson.name, title, shown["figures"])
    for elem_id, data, notes in shown["figures"]:   # each figure has data, or is a note saying why not
        assert data or notes, (lesson.name, title, elem_id)
    if state["tab"] == "lab":
        expect(page.locator("#lab-attn-note")).to_contain_text(state["lab_run"])
    if state.get("show"):   # the figure that holds the lesson's subject: computed, its own data drawn
        page.wait_for_function(SUBJECT, arg=state["show"], timeout=TIMEOUT_MS)
    if "layer" in state and state["tab"] in ("inside", "heads"):
        assert f"layer {state['layer']}" in shown["text"].lower(), (lesson.name, title)


# the fields a lesson's link sets, by (tab, the link's key): their elem_ids
FIELD_IDS = {("attention", "text"): "attn-text", ("generate", "text"): "gen-text", ("heads", "text"): "heads-text",
             ("inside", "text"): "inside-text", ("masks", "text"): "mask-text", ("positions", "text"): "pe-text",
             ("patching", "text"): "patch-clean", ("patching", "corrupted"): "patch-corrupted"}


@pytest.mark.parametrize("model_name", [SMOLLM, "minilm-l6"])
def test_every_lesson_holds_its_answer_until_reveal_and_its_try_it_lands_computed(browser, served, model_name,
                                                                                 encoder_installed):
    """Each lesson in order with Next, on a decoder and an encoder: before Reveal the page does not state the
    measured answer nor the figure's line; Reveal shows them beside the guess; Try it opens the lesson's tab on
    its text and computes there (figures with data, nothing reading Error), the figure of the lesson's subject
    (its link's "show") drawn with data, then the Learn tab again, and on. On the encoder a tab that cannot run
    opens on why, as the lesson's note says; the others compute what an encoder has."""
    url, services = served
    lessons = syllabus.lessons()
    context, page, errors = open_page(browser, f"{url}?model={quote(model_name)}&tab=learn&lesson={lessons[0].name}")
    try:
        for number, lesson in enumerate(lessons, start=1):
            expect(page.locator("#learn-place")).to_contain_text(f"Lesson {number} of {len(lessons)}",
                                                                 timeout=TIMEOUT_MS)
            expect(page.locator("#learn-place")).to_contain_text(lesson.title)
            expect(page.locator("#learn-text")).to_contain_text(f"Measured on {model_name}", timeout=TIMEOUT_MS)
            idle(page)   # every event the lesson's opening set off has run: what the page shows now stays
            expect(page.locator("#learn-answer")).to_be_empty()
            result = measured(services, model_name, lesson)
            revealed(page, lesson, result, held_back(page, lesson, result))
            if model_name == SMOLLM:   # the revealed figure on a phone: the same page, narrowed, then wide again
                on_a_phone(page, lesson)
            landed(page, lesson, result)
            page.get_by_role("tab", name="Learn", exact=True).click()
            if number < len(lessons):
                page.locator("#learn-next").click()
        screenshot(page, f"learn-wide-{model_name}")
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def inside_the_phone(page, selector: str) -> None:
    box, width = page.locator(selector).first.bounding_box(), PHONE["width"]
    assert box["width"] > 0 and box["x"] >= -1 and box["x"] + box["width"] <= width + 1, (selector, box, width)


# the revealed figure's parts as drawn: [name, [left, top, right, bottom]] for each one shown, and the figure's box
# (the title and subtitle are annotations above the plot, ui.plots.base.fit_narrow; plotly's own where a figure
# keeps them)
PARTS = """() => {
  const gd = document.querySelector('#learn-figure .js-plotly-plot');
  const box = (el) => { if (!el) return null; const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 ? [r.left, r.top, r.right, r.bottom] : null; };
  const named = (name) => { const i = (gd.layout.annotations || []).findIndex((a) => a.name === name);
    return i < 0 ? null : gd.querySelector(`.annotation[data-index="${i}"]`); };
  const parts = {title: named('title') || gd.querySelector('.gtitle:not(.gtitle-subtitle)'),
    subtitle: named('subtitle') || gd.querySelector('.gtitle-subtitle'), plot: gd.querySelector('.nsewdrag'),
    legend: gd.querySelector('.legend'), 'x title': gd.querySelector('.g-xtitle'), 'y title': gd.querySelector('.g-ytitle'),
    'x labels': gd.querySelector('.xaxislayer-above'),
    badge: document.querySelector('#learn-figure [data-testid="block-label"]')};
  return [Object.entries(parts).map(([name, el]) => [name, box(el)]).filter(([, b]) => b), box(gd)]; }"""
# pairs that must not overlap on a phone: the title, its subtitle, the plot and the label's badge; the legend and
# the title, subtitle and axis labels
APART = [("title", "subtitle"), ("title", "badge"), ("subtitle", "badge"), ("title", "plot"), ("subtitle", "plot"),
         ("legend", "title"), ("legend", "subtitle"), ("legend", "x title"), ("legend", "y title"),
         ("legend", "x labels")]


def overlap(a, b) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > 1 and min(a[3], b[3]) - max(a[1], b[1]) > 1


def parts_apart(page, lesson) -> None:
    shown, figure = page.evaluate(PARTS)
    parts = dict(shown)
    for first, second in APART:
        if first in parts and second in parts:
            assert not overlap(parts[first], parts[second]), (lesson.name, first, parts[first], second, parts[second])
    for name in ("title", "subtitle", "legend"):   # within the figure's box: not cut at its edges
        if name in parts:
            left, top, right, bottom = parts[name]
            assert left >= figure[0] - 1 and right <= figure[2] + 1, (lesson.name, name, parts[name], figure)
            assert top >= figure[1] - 1 and bottom <= figure[3] + 1, (lesson.name, name, parts[name], figure)


# what a phone shows over and beside the revealed figure's titles: plotly's toolbar (the modebar, boxed whether or
# not a hover has shown it), every annotation (the title, subtitle and panel titles), the values printed on bars;
# and each dropdown shown: its input, the input's text width against its own, and its caret
CROWDED = """() => {
  const gd = document.querySelector('#learn-figure .js-plotly-plot');
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const shown = (el) => el.offsetParent !== null && box(el)[2] > box(el)[0];
  const texts = (selector) => [...gd.querySelectorAll(selector)].filter(shown)
      .map((el) => [el.textContent, box(el)]);
  const dropdowns = [...document.querySelectorAll('.secondary-wrap')].filter(shown).map((wrap) => {
    const input = wrap.querySelector('input'), caret = wrap.querySelector('.icon-wrap');
    const style = getComputedStyle(input), pen = document.createElement('canvas').getContext('2d');
    pen.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    // where the chosen name's letters end on the screen (an input's scrollWidth says only whether it is cut)
    const textRight = box(input)[0] + parseFloat(style.paddingLeft) + pen.measureText(input.value).width;
    return [input.value, input.scrollWidth, input.clientWidth, textRight, caret ? box(caret) : null]; });
  return {modebar: box(gd.querySelector('.modebar')), notes: texts('.annotation'), bars: texts('.bartext'),
          dropdowns}; }"""
APART_PX = 2   # the least gap between the values of neighbouring bars: touching values read as one number


def near(a, b, gap: float) -> bool:
    """Boxes [left, top, right, bottom] that overlap, or come closer than `gap` px on both axes."""
    return min(a[2], b[2]) - max(a[0], b[0]) > -gap and min(a[3], b[3]) - max(a[1], b[1]) > -gap


def uncrowded(page, lesson) -> None:
    """On a phone: the toolbar covers no title, subtitle or panel title, no two of those overlap, the values of
    neighbouring bars keep apart, and each dropdown shows its chosen name whole, with its caret beside it."""
    seen = page.evaluate(CROWDED)
    for text, note in seen["notes"]:
        assert not overlap(seen["modebar"], note), (lesson.name, "the toolbar covers", text, note, seen["modebar"])
    for i, (text, note) in enumerate(seen["notes"]):
        for other, box in seen["notes"][i + 1:]:
            assert not overlap(note, box), (lesson.name, "titles overlap", text, note, other, box)
    for i, (text, bar) in enumerate(seen["bars"]):
        for other, box in seen["bars"][i + 1:]:
            assert not near(bar, box, APART_PX), (lesson.name, "bar values run together", text, bar, other, box)
    for value, text_width, width, text_right, caret in seen["dropdowns"]:
        assert text_width <= width, (lesson.name, "a dropdown cuts its name", value, text_width, width)
        assert caret is None or text_right <= caret[0], (lesson.name, "a caret over the name", value, text_right,
                                                         caret)


def on_a_phone(page, lesson) -> None:
    """At a 390 px phone's width the lesson's panel and revealed figure fit the width, the figure comes under the
    panel, its title, subtitle, plot, legend and axis labels keep apart, and nothing crowds its titles, its bars'
    values or the lesson picker's name (uncrowded); then back to the wide page."""
    page.set_viewport_size(PHONE)
    settled(page)
    for selector in ("#learn-lesson", "#learn-reveal", "#learn-figure .js-plotly-plot"):
        inside_the_phone(page, selector)
    # one column: the figure comes under the lesson's panel, not beside it
    figure, panel = page.locator("#learn-figure").bounding_box(), page.locator("#learn-lesson").bounding_box()
    assert figure["y"] >= panel["y"] + panel["height"] - 1, (figure, panel)
    parts_apart(page, lesson)
    uncrowded(page, lesson)
    if lesson.name == syllabus.lessons()[-1].name:
        screenshot(page, "learn-phone")
    page.set_viewport_size(WIDE)


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
        expect(page.locator("#learn-choose input")).to_have_value(f"3. {short_title(third)} ✓", timeout=TIMEOUT_MS)
        page.wait_for_function("() => window.__saved > 0", timeout=TIMEOUT_MS)
        page.goto(url)               # no query: the page opens on its own tab; the Learn tab resumes at lesson 3
        expect(page.locator("#model-picker")).to_be_visible(timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Learn").click()
        expect(page.locator("#learn-place")).to_contain_text(third.title, timeout=TIMEOUT_MS)
        expect(page.locator("#learn-choose input")).to_have_value(f"3. {short_title(third)} ✓")   # revealed, marked
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
