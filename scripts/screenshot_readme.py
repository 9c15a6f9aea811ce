"""Make the README's screenshot: `python app.py` on the default model, the Attention tab run on the example
text, captured by headless Chromium into assets/screenshot-attention.png.

    python scripts/screenshot_readme.py [--model NAME] [--out PATH]

Not a test (pytest does not collect it); run it again when the Attention tab changes.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", default=str(ROOT / "assets" / "screenshot-attention.png"))
    parser.add_argument("--layer", type=int, default=3)
    parser.add_argument("--head", default="2")
    args = parser.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen(
        [sys.executable, "app.py", "--model", args.model, "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in server.stdout:
            if "Running on local URL" in line:
                break
        else:
            print("the app did not start", file=sys.stderr)
            return 1
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
            page.goto(f"http://127.0.0.1:{port}/")
            expect(page.locator("#model-card table")).to_be_visible(timeout=120_000)
            page.get_by_role("tab", name="Attention").click()
            page.locator("#attn-layer input").fill(str(args.layer))
            page.locator("#attn-head input").fill(args.head)
            page.locator("#attn-head input").press("Enter")
            page.locator("#attn-run").click()
            expect(page.locator("#attn-head-view .js-plotly-plot .hm image")).to_be_attached(timeout=120_000)
            time.sleep(1.0)  # let plotly finish laying out the colour bars
            # page coordinates (bounding_box is relative to the viewport, which scrolls)
            top = (
                page.evaluate("document.querySelector('[role=tablist]').getBoundingClientRect().top + window.scrollY")
                - 10
            )
            bottom = page.evaluate(
                "(() => { const r = document.querySelector('#attn-head-view').getBoundingClientRect();"
                " return r.bottom + window.scrollY; })()"
            )
            page.screenshot(
                path=args.out, full_page=True, clip={"x": 0, "y": top, "width": 1360, "height": bottom - top + 10}
            )
            browser.close()
        print(args.out)
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
