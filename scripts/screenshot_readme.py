"""Make the README's screenshots: `python app.py` on the default model, the Attention tab's first screen (what
a newcomer sees: the default text on the head the tab opens on, nothing clicked), captured by headless Chromium at
1400 × 1000 into assets/screenshot-attention.png and on a 390 × 844 phone into assets/screenshot-phone.png.

    python scripts/screenshot_readme.py [--model NAME] [--out PATH] [--phone PATH]

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
    parser.add_argument("--phone", default=str(ROOT / "assets" / "screenshot-phone.png"))
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
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
            page.goto(f"http://127.0.0.1:{port}/")
            expect(page.locator("#attn-note")).to_contain_text("Opened on", timeout=300_000)
            expect(page.locator("#attn-head-view .js-plotly-plot .hm image")).to_be_attached(timeout=120_000)
            time.sleep(1.5)  # let plotly finish laying out the colour bars
            page.screenshot(path=args.out, clip={"x": 0, "y": 0, "width": 1400, "height": 1000})
            phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
            phone.goto(f"http://127.0.0.1:{port}/")
            expect(phone.locator("#attn-note")).to_contain_text("Opened on", timeout=120_000)
            expect(phone.locator("#attn-head-view .js-plotly-plot .hm image")).to_be_attached(timeout=120_000)
            time.sleep(1.5)
            phone.screenshot(path=args.phone, full_page=True, clip={"x": 0, "y": 0, "width": 390, "height": 1688})
            browser.close()
        print(args.out, args.phone)
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
