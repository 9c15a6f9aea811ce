"""Exports in the page: figures that carry their modebar's image settings, the SVG button beside Plotly's PNG one,
and the file box each tab's data download lands in. The files themselves are built in ui/export.py."""

from __future__ import annotations

import gradio as gr
import plotly.graph_objects as go
from gradio.components.plot import PlotData

from ui import export

# Runs once when a page opens (demo.load js=). Gradio's plot component draws with Plotly.react(gd, data, layout,
# config), passing the `config` of the figure JSON (export.figure_json puts toImageButtonOptions there); this hook
# adds a second modebar button that downloads the same figure, at the same size and name, as SVG. Plotly's bundle is
# loaded lazily, when the first plot is drawn, so the hook waits for window.Plotly to be set.
SVG_BUTTON_JS = """
() => {
  const hook = (Plotly) => {
    if (!Plotly || Plotly.__svgButton) return;
    Plotly.__svgButton = true;
    const react = Plotly.react;
    Plotly.react = function (gd, data, layout, config) {
      const options = config && config.toImageButtonOptions;
      if (options) {
        const svg = {
          name: "downloadSvg",
          title: "Download plot as SVG",
          icon: {width: 1000, height: 1000, path: "M100 100h800v800h-800z M250 650l150-200 120 150 80-100 150 150z"},
          click: (g) => Plotly.downloadImage(g, Object.assign({}, options, {format: "svg", scale: 1})),
        };
        config = Object.assign({}, config, {modeBarButtonsToAdd: [...(config.modeBarButtonsToAdd || []), svg]});
      }
      return react.call(this, gd, data, layout, config);
    };
  };
  if (window.Plotly) { hook(window.Plotly); return; }
  let current;
  Object.defineProperty(window, "Plotly", {
    configurable: true,
    get: () => current,
    set: (value) => { current = value; hook(value); },
  });
}
"""


def plot(fig: go.Figure | None, name: str):
    """What a gr.Plot output takes: the figure with its modebar's image settings (PNG, SVG at slide size, `name`)."""
    if not isinstance(fig, go.Figure):
        return fig
    return PlotData(type="plotly", plot=export.figure_json(fig, name))


def file_box(elem_id: str, label: str = "Data behind the figures") -> gr.File:
    """Where a tab's data download appears: a link the browser saves."""
    return gr.File(label=label, interactive=False, elem_id=elem_id, height=80)
