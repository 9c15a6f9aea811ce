"""The Generate tab's page while a generation streams, in headless Chromium: how busy the browser's main thread
is (long tasks over 50 ms, the worst lag of a 50 ms timer), how often the token strip is redrawn, and how long a
click on Stop takes to land. The tiny random Llama of the tests, paced to 0.02 s a token like a real model.

  --old REV   build the Generate tab from REV's ui/tabs/generate.py (e.g. one that redraws the strip per token)
  --every S   send the page an update at most every S seconds after the first tokens (ui/views/generate.paced)
With --publish the runs' table goes to docs/reliability.md (section stop-click).
Usage: python bench/stop_click.py [--old REV] [--every S] [--runs 1] [--publish]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

MONITOR = """() => { window.__m = {long: 0, longCount: 0, maxLag: 0, mut: 0};
  new PerformanceObserver((l) => { for (const e of l.getEntries()) { window.__m.long += e.duration;
    window.__m.longCount++; } }).observe({type: 'longtask', buffered: false});
  let last = performance.now();
  setInterval(() => { const now = performance.now(); window.__m.maxLag = Math.max(window.__m.maxLag, now - last - 50);
    last = now; }, 50);
  new MutationObserver((m) => { window.__m.mut += m.length; }).observe(document.getElementById('gen-strip'),
    {subtree: true, childList: true, characterData: true, attributes: true}); }"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", help="a git revision whose ui/tabs/generate.py builds the tab")
    parser.add_argument("--every", type=float, help="seconds between the page's updates after the first tokens")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--publish", action="store_true", help="write the runs' table into docs/reliability.md")
    args = parser.parse_args()
    if args.every is not None:
        from ui.views import generate as views
        views.paced.__defaults__ = (args.every, views.SHOWN_FIRST)
    if args.old:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.old}:ui/tabs/generate.py"],
                                capture_output=True, text=True, check=True).stdout
        import ui.tabs.generate as tab
        exec(compile(source, tab.__file__, "exec"), tab.__dict__)  # noqa: S102 - our own history
    from playwright.sync_api import expect, sync_playwright
    from tiny_app_model import build_tiny_llama, launch_app

    llama = str(build_tiny_llama(Path(tempfile.mkdtemp()) / "tiny-llama"))
    demo, url, services = launch_app([llama], llama)
    model = services.models.get(llama)
    real_stream = model.stream

    def paced(*a, **k):
        for token in real_stream(*a, **k):
            time.sleep(0.02)
            yield token

    model.stream = paced
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        for run in range(args.runs):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            expect(page.locator("#attn-run")).to_be_visible(timeout=120_000)
            page.get_by_role("tab", name="Generate").click()
            page.locator("#gen-chat input").uncheck()
            box = page.locator("#gen-max-new input[type=number]")
            box.fill("512")
            box.press("Enter")
            page.wait_for_timeout(2000)  # the tab's first drawing done, so "idle" is idle
            page.evaluate(MONITOR)
            time.sleep(5)
            idle = page.evaluate("window.__m")
            page.evaluate("() => { window.__m.long = 0; window.__m.longCount = 0; window.__m.maxLag = 0; }")
            page.locator("#gen-run").click()
            expect(page.locator("#gen-stats")).to_contain_text("writing", timeout=120_000)
            time.sleep(5)
            busy = page.evaluate("window.__m")
            started = time.perf_counter()
            page.locator("#gen-stop").click(timeout=120_000)
            clicked = time.perf_counter() - started
            try:
                expect(page.locator("#gen-stats")).to_contain_text("stopped", timeout=120_000)
                stopped = time.perf_counter() - started
                landed = f"'stopped' after {stopped:.2f} s"
            except AssertionError:
                stopped, landed = None, "the generation ended before Stop landed"
            rows.append([run + 1, f"{idle['longCount']} ({idle['long']:.0f} ms)",
                         f"{busy['longCount']} ({busy['long']:.0f} ms)", f"{busy['maxLag']:.0f} ms", busy["mut"],
                         f"{clicked:.2f} s", f"{stopped:.2f} s" if stopped is not None else "never (it ended first)"])
            print(f"run {run}: idle 5 s: long tasks {idle['longCount']} ({idle['long']:.0f} ms); first 5 s of the "
                  f"stream: long tasks {busy['longCount']} ({busy['long']:.0f} ms), worst timer lag "
                  f"{busy['maxLag']:.0f} ms, strip mutations {busy['mut']}; Stop click {clicked:.2f} s, {landed}",
                  flush=True)
            page.close()
        browser.close()
    demo.close()
    if args.publish:
        from common import DOCS, md_table, publish
        version = (f"the Generate tab of {args.old}" if args.old else "the Generate tab as it is") + (
            f", updates every {args.every:g} s" if args.every is not None else "")
        publish("stop-click", f"{version}; the tests' tiny Llama paced to 0.02 s a token, 512 tokens asked, headless "
                              f"Chromium, {args.runs} run(s), a fresh page each. Long tasks: the browser's tasks over "
                              "50 ms (count, total); timer lag: the worst delay of a 50 ms timer in the first 5 s of "
                              "the stream; Stop: how long the click took, and until the page said 'stopped'.\n\n" +
                md_table(["run", "long tasks, idle 5 s", "long tasks, first 5 s of the stream", "worst timer lag",
                          "strip mutations", "Stop click", "until 'stopped'"], rows,
                         ["---:", "---:", "---:", "---:", "---:", "---:", "---:"]), doc=DOCS / "reliability.md")


if __name__ == "__main__":
    main()
