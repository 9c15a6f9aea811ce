"""The two-column view's hover filter: a script that, in the browser, shows only the lines of the hovered token.

ui/plots/attention.two_column_view draws every query's lines, and the same lines grouped per key at opacity 0; each
line trace's meta names its side ("query" or "key"), its token and its own opacity, and a transparent heatmap with
meta role "tokens" is what the pointer hits over a token (column 0 the queries, column 2 the keys, row = token).
Hovering query i shows only query i's lines, hovering key j only the lines into key j; leaving shows every query's
lines again. Only opacities change (a style restyle: nothing is recomputed), and no token text is read or written.
"""

from __future__ import annotations

import json

# Runs when its gr.HTML loads (js_on_load), and finds the plots as PLOT_CLICK_JS in ui/tabs/widgets.py does: a
# MutationObserver attaches the listeners to `#<elem_id> .js-plotly-plot` whenever Gradio draws a new one.
HOVER_FILTER_JS = """
const shown = new WeakMap();
const show = (gd, side, index) => {
  const key = side === null ? "all" : `${side}.${index}`;
  const last = shown.get(gd);  // Plotly.react of a new figure replaces gd.data, so a stale entry never matches
  if ((last && last.data === gd.data && last.key === key) || !window.Plotly) return;
  const traces = [], opacity = [];
  gd.data.forEach((trace, k) => {
    const meta = trace.meta;
    if (!meta || meta.role !== "lines") return;
    traces.push(k);
    const visible = side === null ? meta.side === "query" : meta.side === side && meta.index === index;
    opacity.push(visible ? meta.opacity : 0);
  });
  if (!traces.length) return;
  shown.set(gd, { data: gd.data, key });
  window.Plotly.restyle(gd, { opacity }, traces);
};
const handlers = new WeakMap();
const handlersOf = (gd) => {
  if (!handlers.has(gd)) {
    handlers.set(gd, {
      hover: (event) => {
        const point = event.points && event.points[0];
        if (!point || !point.data.meta || point.data.meta.role !== "tokens") return;
        const [row, column] = point.pointNumber;
        show(gd, column === 0 ? "query" : "key", row);
      },
      unhover: () => show(gd, null, null),
    });
  }
  return handlers.get(gd);
};
const attach = () => {
  for (const id of PLOTS) {
    const gd = document.querySelector(`#${id} .js-plotly-plot`);
    if (!gd || !gd._ev) continue;
    const { hover, unhover } = handlersOf(gd);
    if (gd._ev.listeners("plotly_hover").includes(hover)) continue;
    gd.on("plotly_hover", hover);
    gd.on("plotly_unhover", unhover);
  }
};
new MutationObserver(attach).observe(document.body, { childList: true, subtree: true });
attach();
"""


def hover_filter_js(plot_elem_ids: list[str]) -> str:
    """The hover filter for the two-column views in the plots with these elem_ids, as a gr.HTML's js_on_load."""
    return HOVER_FILTER_JS.replace("PLOTS", json.dumps(plot_elem_ids))
