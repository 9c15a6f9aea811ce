"""The Inside tab's "every key" figure as plotly.js draws it in Chromium: its legend covers neither the x-axis title
nor the figure's title, and stays inside the figure, at a wide width and on a phone.

The figure is ui.plots.inside.content_position_figure's, drawn by the plotly.js of the installed plotly package
(what the page's gr.Plot draws with), so the boxes measured are the ones a reader sees."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (bash scripts/setup_tests.sh)")

from ui.plots.inside import content_position_figure  # noqa: E402

# a RoPE model's three series over 24 keys, labels long enough to be drawn slanted (as on a real text)
TOKENS = [f" token{i}" for i in range(24)]
SERIES = {"the score (after RoPE)": np.linspace(-2, 3, 24), "without the rotation (content alone)": np.linspace(1, -1, 24),
          "what the rotation adds (position)": np.linspace(-3, 4, 24)}
WIDTHS = {"wide": 900, "phone": 360}  # the plot's width in the 1400 px page's wide column, and on a 390 px phone


def boxes(page, width: int) -> dict:
    fig = content_position_figure(TOKENS, SERIES, 23, "Every key of ' token23', layer 1, head 2")
    fig.update_layout(width=width)
    page.set_content(fig.to_html(include_plotlyjs=True, full_html=True))
    page.wait_for_selector(".legend .traces", state="attached")
    return page.evaluate("""() => {
        const box = (sel) => { const e = document.querySelector(sel); if (!e) return null;
            const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, right: r.right, bottom: r.bottom}; };
        return {legend: box('.legend .bg') || box('.legend'), xtitle: box('.g-xtitle text'),
                title: box('.g-gtitle text'), figure: box('.main-svg')};
    }""")


def overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["right"] and b["x"] < a["right"] and a["y"] < b["bottom"] and b["y"] < a["bottom"]


@pytest.mark.parametrize("name", WIDTHS)
def test_the_every_key_legend_covers_no_title(browser, name):
    context = browser.new_context(viewport={"width": WIDTHS[name] + 40, "height": 900})
    try:
        found = boxes(context.new_page(), WIDTHS[name])
    finally:
        context.close()
    legend, xtitle, title, figure = found["legend"], found["xtitle"], found["title"], found["figure"]
    assert legend and xtitle and title, found
    assert not overlap(legend, xtitle), f"the legend covers the x-axis title: {found}"
    assert not overlap(legend, title), f"the legend covers the figure's title: {found}"
    inside = (legend["x"] >= figure["x"] - 1 and legend["right"] <= figure["right"] + 1
              and legend["y"] >= figure["y"] - 1 and legend["bottom"] <= figure["bottom"] + 1)
    assert inside, f"the legend is cut by the figure's edge: {found}"
