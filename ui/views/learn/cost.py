"""The cost of attention in the course's figures. The quadratic term in the Inside tab: one attention layer timed
alone from 256 to 8,192 tokens, dense, online and fused, with the fitted exponents and the whole model beside it, as
the shipped measurement states them (ui/services/learn/cost.py), a table and its sentence. The approximations
lesson's figure (ui/services/learn/efficient.py): above, one attention layer alone against length on log axes, exact
attention three ways and each sparse or linear approximation as the published run timed them, the first crossover
marked; below, what each approximation did to the loaded model on the lesson's text (its perplexity over exact
attention's, or its sentence embedding's cosine with the exact one). Without the published run, the lower panel
alone."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import base_layout, empty_figure, log_axis
from ui.plots.charts import with_subtitle
from ui.services.learn.cost import COST_BENCH, COST_METHOD_WORDS, COST_METHODS, attention_cost, cost_sentence, mib

HEAD = "**The quadratic term, measured: one attention layer alone at long lengths**"


def cost_markdown() -> str:
    """The medians per length and method, then the exponents in words with what was measured and the command."""
    cost = attention_cost()
    if cost is None:
        return f"{HEAD}: not measured in this copy; `{COST_BENCH} --publish` measures it (a few minutes)."
    lines = [f"{HEAD} (saved, not timed on this page: the longest layer alone takes seconds). "
             + "; ".join(f"*{m}*: {COST_METHOD_WORDS[m]}" for m in COST_METHODS) + ".", "",
             "| tokens n | " + " | ".join(f"{m}: median ms" for m in COST_METHODS) + " | "
             + " | ".join(f"{m}: peak added" for m in COST_METHODS) + " |",
             "|---:|" + "---:|" * (2 * len(COST_METHODS))]
    for i, n in enumerate(cost.layer["dense"].lengths):
        times = [f"{1e3 * cost.layer[m].seconds[i]:,.1f}" for m in COST_METHODS]
        peaks = [mib(cost.layer[m].peak[i]) for m in COST_METHODS]
        lines.append(f"| {n:,} | " + " | ".join(times + peaks) + " |")
    return "\n".join(lines) + "\n\n" + cost_sentence(cost, command=True)


EXACT_STYLE = {"sdpa": {"color": "black", "width": 3}, "eager": {"color": "grey", "dash": "dot"},
               "online": {"color": "grey", "dash": "dash"}, "sdpa_bi": {"color": "black", "dash": "dot"}}
EXACT_NAMES = {"sdpa": "exact, fused", "eager": "exact, every weight held", "online": "exact, online softmax",
               "sdpa_bi": "exact, fused, no mask"}
CROSSOVER = "crossover"
PANELS = ("one attention layer alone", "this model, on the lesson's text")


def measure_title(v: dict) -> str:
    return "perplexity ÷ exact (log scale)" if v["measure"] == "perplexity" else "cosine with the exact embedding"


def time_range(bench: dict) -> tuple[float, float]:
    """The smallest and largest median ms the time panel draws (where a vertical mark spans)."""
    ms = [1e3 * s for m in bench["methods"].values() for s in m["seconds"]]
    return min(ms), max(ms)


def time_panel(fig, bench: dict) -> str:
    """The run's medians per method (exact attention in black and grey), the first crossover as a vertical line and
    a point on its curve; returns the subtitle's words for it."""
    for method, run in bench["methods"].items():
        fig.add_trace(go.Scatter(x=run["lengths"], y=np.asarray(run["seconds"]) * 1e3, mode="lines+markers",
                                 name=EXACT_NAMES.get(method, run["name"]), line=EXACT_STYLE.get(method)),
                      row=1, col=1)
    low, high = time_range(bench)
    cross = bench["crossover"]
    if cross is not None:
        fig.add_trace(go.Scatter(x=[cross["length"]] * 2, y=[low, high], mode="lines", hoverinfo="skip",
                                 name=f"{CROSSOVER}: {cross['name']} from ≈{cross['length']:,.0f} tokens",
                                 line={"color": "seagreen", "dash": "dashdot", "width": 2}), row=1, col=1)
        fig.add_trace(go.Scatter(x=[cross["n"]], y=[1e3 * cross["seconds"]], mode="markers", showlegend=False,
                                 name=f"{cross['name']} at {cross['n']:,} tokens: {cross['ratio']:.2f}× exact",
                                 marker={"color": "seagreen", "size": 13, "symbol": "star"}), row=1, col=1)
    lengths = bench["lengths"]
    fig.update_xaxes(title_text="tokens n", row=1, col=1,
                     **log_axis(lengths, ticks=lengths, labels=[f"{n:,}" for n in lengths]))
    fig.update_yaxes(title_text=f"ms a call (median of {bench['repeats']})", row=1, col=1,
                     **log_axis([low, high]))
    threads = "one thread" if bench["threads"] == 1 else f"{bench['threads']} threads"
    return f"timed on a {'GPU' if bench['on_gpu'] else 'CPU'}, {threads}, {bench['date']}"


def live_panel(fig, v: dict, row: int) -> str:
    """A bar per approximation the model ran: its perplexity over exact attention's, or the cosine of its sentence
    embedding with the exact one; returns the subtitle's words (the methods it refused)."""
    ran = [r for r in v["live"] if not r["refused"]]
    names = [r["short"] for r in ran]
    shown = [r["shown"] for r in ran]
    perplexity = v["measure"] == "perplexity"
    text = [f"{s:,.3g}×" if perplexity else f"{s:.3f}" for s in shown]
    fig.add_trace(go.Bar(x=names, y=shown, text=text, textposition="outside", cliponaxis=False, showlegend=False,
                         name=measure_title(v), marker={"color": "#4c78a8"}), row=row, col=1)
    if perplexity:
        fig.update_yaxes(row=row, col=1, **log_axis(shown + [1.0]))
    else:
        fig.update_yaxes(row=row, col=1, range=[min(0.0, *shown) - 0.05, 1.1])
    fig.update_yaxes(title_text=measure_title(v), row=row, col=1)
    refused = [r["name"] for r in v["live"] if r["refused"]]
    return f"not run on this model: {', '.join(refused)}" if refused else ""


def efficient_figure(measured):
    """Two panels (one where the run is not published): the run's times with the crossover, this model's change."""
    v = measured.values
    bench = v.get("bench")
    if not bench and not any(not r["refused"] for r in v["live"]):
        return empty_figure(measured.alt)
    rows = 2 if bench else 1
    titles = PANELS if bench else PANELS[1:]
    fig = make_subplots(rows=rows, cols=1, subplot_titles=titles, vertical_spacing=0.2)
    words = [time_panel(fig, bench)] if bench else []
    if any(not r["refused"] for r in v["live"]):
        words.append(live_panel(fig, v, rows))
    base_layout(fig, "Faster from how many tokens, and at what cost to the model", 420 * rows)
    fig.update_layout(legend={"orientation": "h", "y": -0.12})
    return with_subtitle(fig, "; ".join(w for w in words if w) + f"; the text is {v['tokens']} tokens")


def guess_place(v: dict, guess: float):
    """The reader's guess as a vertical line across the time panel (a log axis holds no guess ≤ 0)."""
    if not v.get("bench") or guess <= 0:
        return None
    low, high = time_range(v["bench"])
    return [guess, guess], [low, high]


FIGURES = {"approximations": efficient_figure}
