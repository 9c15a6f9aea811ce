"""The Masks tab's approximate-attention section: one text under top-k, BigBird, Performer, Linformer or a low-rank
KV cache, each head's error beside exact attention as two maps (the weights' total variation, the output's relative
error), the model's change and the cache's bytes in a small figure and in words; and what the methods cost in time,
the published bench run (with where each becomes faster) beside a live timing here at short lengths. The bodies of
the page's two buttons and of the `approximation` and `attention_cost` endpoints (JSON, API only). A refusal on the
page is the note, beside figures in their stated empty state."""

from __future__ import annotations

from ui.plots.approx import change_figure, cost_figure, error_map
from ui.plots.base import empty_figure
from ui.services import Services
from ui.services.approx import (MAX_APPROX_TOKENS, ApproxRun, approximation_run, budget_from_fields, bytes_words,
                                change_words)
from ui.services.approx.cost import (PublishedCost, live_budgets, live_cost, live_table, live_words,
                                     published_cost, published_table, published_words)
from ui.services.checks import UserError
from ui.views.export import filename, named

NOT_DRAWN = "Not computed: the note says why."
TV_DEFINITION = "½ Σ_j |p̂_ij − p_ij| of each query's weights, averaged over the text's queries"
Z_DEFINITION = "‖ẑ − z‖ / ‖z‖ of the head's output over the text, on the same q, k, v as exact attention"


def approx_view(services: Services, model_name, text_value, method, k, block, global_blocks, random_blocks, features,
                rank, fit, seed, layers, progress=None):
    """(note, weights map, output map, change figure, words): the page's run, its budget read from the fields the
    method takes."""
    fields = dict(k=k, block=block, global_blocks=global_blocks, random_blocks=random_blocks, features=features,
                  rank=rank, fit=fit, seed=seed)
    try:
        budget = budget_from_fields(method, fields) if isinstance(method, str) else None
        run = approximation_run(services.models, model_name, text_value, method, budget, layers,
                                services.settings.text_cap_bytes, MAX_APPROX_TOKENS, progress)
    except UserError as refusal:
        empty = empty_figure(NOT_DRAWN)
        return f"⚠️ The approximation did not run: {refusal}", empty, empty, empty, ""
    note = (f"All {run.tokens:,} tokens of the text read (at most {MAX_APPROX_TOKENS:,}, never cut); "
            f"{run.description} on {run.where}, each head measured beside exact attention on the same queries, keys "
            "and values.")
    return (note, *run_figures(run, model_name), change_words(run) + "\n\n" + bytes_words(run))


def run_figures(run: ApproxRun, model_name: str) -> tuple:
    """The two error maps (the weights' one empty for Linformer, which has no weight per key) and the change."""
    if run.tv is None:
        weights = empty_figure("Linformer weighs rank mixed rows, not the keys: there are no weights per key to compare."
                               " The output's error is beside it.")
    else:
        weights = error_map(run.tv, "total variation", f"Each head's weights under {run.description}: total "
                            "variation from exact", f"{TV_DEFINITION}; grey: not approximated")
    output = error_map(run.z_error, "relative error of z", f"Each head's output under {run.description}: relative "
                       "error", f"{Z_DEFINITION}; grey: not approximated")
    if run.measure == "perplexity":
        title = f"Perplexity {run.exact:,.2f} → {run.approximate:,.2f} ({run.change:+.1%}); cache bytes per token"
    else:
        title = f"Sentence embedding's cosine to exact: {run.approximate:.5f}; cache bytes per token"
    change = change_figure(run.measure, run.exact, run.approximate, run.bytes_exact, run.bytes_approx, title)
    return (named(weights, filename(model_name, f"approx-{run.method}-tv")),
            named(output, filename(model_name, f"approx-{run.method}-z-error")),
            named(change, filename(model_name, f"approx-{run.method}-change")))


def shown_name(model_name: str) -> str:
    """A model as the words name it: a folder by its last part, never the server's path to it."""
    return str(model_name).rstrip("/").split("/")[-1]


NOT_PUBLISHED = "The cost run has not been published yet: the words below say how to make it."
NOT_READ = "The published cost run could not be read: the words below say why."


def published_figure(cost: PublishedCost | None, why: str = NOT_PUBLISHED):
    """The published run's times against length, or the empty figure saying why there is none (the words give the
    command)."""
    if cost is None:
        return empty_figure(why, 260)
    methods = cost.methods.values()
    crossings = {c["method"]: c["n"] for c in cost.crossovers if c.get("n") is not None}
    where = "a GPU" if cost.on_gpu else "the bench's CPU"
    return cost_figure({m.method: m.lengths for m in methods}, {m.method: m.seconds for m in methods},
                       {m.method: f"{m.method}: {m.words}" for m in methods}, crossings,
                       "One attention layer's time against length (published run)",
                       f"{cost.machine} ({where}), {cost.date}; ★ the first length where an approximation is faster "
                       "than its exact reference", dashed=[m.method for m in methods if not m.causal])


def published_or_why() -> tuple[PublishedCost | None, str]:
    """The published run and its words; a damaged file is said in the words, and the live timing still runs."""
    try:
        cost = published_cost()
    except UserError as error:
        return None, f"⚠️ {error}"
    return cost, published_words(cost)


def cost_view(services: Services, model_name, progress=None):
    """(cost figure, words): the published run drawn, with its words, then the live timing at short lengths."""
    cost, words = published_or_why()
    why = NOT_READ if words.startswith("⚠️") else NOT_PUBLISHED
    try:
        model = services.models.get(model_name, progress)
    except UserError as refusal:
        return published_figure(cost, why), f"{words}\n\n⚠️ The live timing did not run: {refusal}"
    live = live_cost(model, shown_name(model_name), live_budgets(cost))
    figure = named(published_figure(cost, why), filename(model_name, "approx-cost"))
    return figure, f"{words}\n\n{live_words(live)}"


def approximation_data(services: Services, model_name, text_value, method, budget=None, layers="all") -> dict:
    """The body of the `approximation` endpoint: the run as a JSON object (ApproxRun.as_json); bad input is an error
    in words."""
    run = approximation_run(services.models, model_name, text_value, method, budget, layers,
                            services.settings.text_cap_bytes, MAX_APPROX_TOKENS)
    return run.as_json()


def attention_cost_data(services: Services, model_name) -> dict:
    """The body of the `attention_cost` endpoint: the published table (null where none is published) with its words,
    and the live timing at short lengths on the loaded model's attention shape."""
    model = services.models.get(model_name)
    cost = published_cost()
    live = live_cost(model, shown_name(model_name), live_budgets(cost))
    return {"published": published_table(cost), "published_words": published_words(cost),
            "live": live_table(live), "live_words": live_words(live)}
