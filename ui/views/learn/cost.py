"""The quadratic term in the Inside tab: one attention layer timed alone from 256 to 8,192 tokens, dense, online
and fused, with the fitted exponents and the whole model beside it, as the shipped measurement states them
(ui/services/learn/cost.py). Markdown only: a table and its sentence."""

from __future__ import annotations

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
