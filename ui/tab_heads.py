"""Heads tab: what each head does (scores per layer × head, the induction probe), whether the output depends on
it (ablation, the sweep), which inputs one prediction depends on (attribution against attention), what each
layer would predict (the logit lens), and how surprised the model is by each token."""

from __future__ import annotations

import time

import gradio as gr
import numpy as np

from core.heads import LOCAL_WINDOW, SCORES
from ui import downloads, export, plots, service
from ui.common import (
    ANALYSIS,
    ANALYSIS_LIMIT,
    index_of,
    kept_index,
    head_figure,
    progress_callback,
    read_example,
    text_with_upload,
    user_errors,
)
from ui.links import TabControls
from ui.model_picker import Picker
from ui.service import UserError

CACHE_TTL_S = 1800  # a session's kept results are dropped after half an hour
SHOWN_NAMES = 12  # named heads listed per score before "and N more"

SCORE_LABELS = {
    "previous_token": "previous-token",
    "first_token": "first-token (sink) mass",
    "local": f"local window (|i − j| ≤ {LOCAL_WINDOW})",
    "entropy": "mean entropy",
    "duplicate_token": "duplicate-token",
    "induction": "induction (on the probe)",
}
FRACTIONS = ("previous_token", "first_token", "local", "duplicate_token", "induction")  # weights in [0, 1]

LEAD = """**What each head of eq. 3.1 does, and whether the output depends on it**: scores of every head's eq. 2.1
attention map, ablation, attribution, the logit lens and surprisal."""

INTRO = f"""Heads specialise. Each score below is one number per layer × head, measured on your text: where the
head's attention goes. Choose a tile (click it, or type its layer and head) to see that head's map. Then ask
whether the output **depends** on a head (ablation), which inputs one prediction is **sensitive** to
(attribution), what each layer **would predict** (the logit lens) and how **surprised** the model is by each
token. The tab reads the first {service.MAX_HEADS_TOKENS} tokens of the text; the sweep the first
{service.MAX_SWEEP_TOKENS}."""

NOT_EXPLANATION = (
    "A strong attention weight says where a head looked, not why the model decided anything: attention weights "
    "are not explanations. Gradients measure what the prediction is sensitive to."
)


def score_choices(model) -> list[tuple[str, str]]:
    return [(SCORE_LABELS[name], name) for name in service.score_names(model)]


def model_note(model) -> str:
    """What this model's heads can be asked, and why some sections have nothing to show."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        kind = "an encoder-decoder: the scores and head maps are its encoder's self-attention (both directions)"
    elif not cfg.causal:
        kind = (
            "an encoder: every token attends in both directions, so previous-token and local scores say where a "
            "head looks, not what it predicts from. There is no induction score: the probe measures next-token "
            "prediction, which an encoder does not make"
        )
    else:
        kind = "a decoder: each token attends to itself and the tokens before it"
    missing = []
    for what, reason in (
        ("ablation and the sweep", service.lm_head_reason(model, "Ablation")),
        ("attribution", service.lm_head_reason(model, "Attribution")),
        ("the logit lens", service.lm_head_reason(model, "The logit lens")),
        ("surprisal", service.next_token_reason(model, "Surprisal")),
    ):
        if reason:
            missing.append(what)
    note = f"This model is {kind}."
    if missing:
        note += f" Not available for it: {', '.join(missing)} (each section says why)."
    return note


def thresholds_markdown(model, named: dict[str, list[tuple[int, int, float]]]) -> str:
    """The naming thresholds (from core.heads.SCORES) and the heads that pass them on this text."""
    lines = [
        "| score | what it measures | names a head at | as |",
        "|---|---|---:|---|",
    ]
    for name in service.score_names(model):
        description, threshold, head_name = SCORES[name]
        at = f"≥ {threshold:g}" if threshold is not None else "–"
        cells = (SCORE_LABELS[name], description, at, head_name or "–")
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines += ["", "Thresholds are set so that the same model with random weights names no head.", ""]
    found = []
    for name, hits in named.items():
        if not hits:
            continue
        shown = ", ".join(f"{layer}.{head} ({value:.2f})" for layer, head, value in hits[:SHOWN_NAMES])
        more = f" and {len(hits) - SHOWN_NAMES} more" if len(hits) > SHOWN_NAMES else ""
        found.append(f"- **{SCORES[name][2]}s** ({len(hits)}): {shown}{more}")
    lines += ["**Named heads** (layer.head, score):", *(found or ["- none: no head passes a threshold on this text."])]
    return "\n".join(lines)


def top_table(scores: dict, named: dict) -> list[list]:
    """Rows [score, rank, head, value, named] of the top heads per score (lowest entropy first)."""
    rows = []
    for name, table in scores.items():
        names = {(layer, head) for layer, head, _ in named.get(name, [])}
        for rank, (layer, head, value) in enumerate(service.top_heads(table, name), start=1):
            rows.append([SCORE_LABELS[name], rank, f"{layer}.{head}", round(value, 4),
                         SCORES[name][2] if (layer, head) in names else ""])
    return rows


def head_view(model, tokens: service.Encoded, layer: int, head: int):
    matrix = service.head_map(model, tokens.ids, layer, head)
    return head_figure(tokens, matrix, f"Layer {layer}, head {head} on your text")


def score_map_figure(name: str, table: np.ndarray, named: dict, suffix: str = ""):
    description, threshold, head_name = SCORES[name]
    title = f"{SCORE_LABELS[name]}: {description}{suffix}"
    if threshold is not None:
        title += f"<br>ringed: ≥ {threshold:g}, {head_name}s"
    marked = [(layer, head) for layer, head, _ in named.get(name, [])]
    return plots.head_score_map(table, title, SCORE_LABELS[name], zmax=1.0 if name in FRACTIONS else None,
                                marked=marked)


def atlas_view(store: service.ModelStore, name, text, score, layer, head, previous=None, progress=None):
    """The chosen score's map, the top heads, the thresholds and named heads, and one head's map; the body of
    the `head_atlas` endpoint. Returns (note, map, table, thresholds, head view, cache)."""
    model = store.get(name, progress)
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    score = service.check_score(model, score)
    layer, head = check_head(model, layer, head)
    started = time.perf_counter()
    cache = service.heads_cache(previous, name, tokens)
    kept = cache.scores is not None
    scores = service.head_scores(model, cache)
    named = service.named_heads(scores)
    seconds = time.perf_counter() - started
    notes = [
        f"**{len(tokens.ids):,} tokens**, "
        + ("scores kept from the last run." if kept else f"every head scored in {seconds:.2f} s.")
    ]
    if tokens.note:
        notes.append("⚠️ " + tokens.note)
    probe = cache.induction
    if probe is not None:
        notes.append(
            f"Induction probe: {service.INDUCTION_LENGTH} random tokens (seed {service.INDUCTION_SEED}), then the "
            f"same {service.INDUCTION_LENGTH} again. Next-token loss on the first copy **{probe.loss_first:.2f}** "
            f"nats, on the second **{probe.loss_second:.2f}** nats: the second copy can only be predicted by "
            "looking back at the first, which is what induction heads do."
        )
    if model.config.is_encoder_decoder or not model.config.causal:
        notes.append(model_note(model))
    suffix = " (on the probe)" if score == "induction" else ""
    map_fig = score_map_figure(score, service.to_numpy(scores[score]), named, suffix)
    return (
        "  \n".join(notes),
        map_fig,
        top_table(scores, named),
        thresholds_markdown(model, named),
        head_view(model, tokens, layer, head),
        cache,
    )


def check_head(model, layer, head) -> tuple[int, int]:
    n_layers, n_heads = service.scored_shape(model)
    return (service.check_range("Layer", layer, 0, n_layers - 1), service.check_range("Head", head, 0, n_heads - 1))


def open_head(store: service.ModelStore, name, text, layer, head):
    """One head's map on the text, from the layer/head inputs."""
    model = store.get(name)
    layer, head = check_head(model, layer, head)
    return head_view(model, service.encode(model, text, service.MAX_HEADS_TOKENS), layer, head)


def empty_table() -> list[list]:
    return []


def ablation_view(store: service.ModelStore, name, text, heads_text, kind, progress=None):
    """Loss change per token and the changed predictions; the body of the `ablate_heads` endpoint."""
    model = store.get(name, progress)
    reason = service.lm_head_reason(model, "Ablation")
    if reason:
        return reason, plots.empty_figure(reason), empty_table()
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    pairs = service.parse_heads(heads_text, *service.scored_shape(model))
    view = service.ablation(model, tokens, pairs, kind)
    clean, ablated = float(view.clean_loss.mean()), float(view.ablated_loss.mean())
    listed = service.format_heads(pairs)
    what = "next-token loss" if model.config.causal else "loss on each token from its own position (masked-LM head)"
    fig = plots.loss_change_figure(
        view.labels, view.clean_loss, view.ablated_loss,
        f"Loss change with {listed} {kind}-ablated (red: worse without them)",
    )
    predictions = "next-token predictions" if model.config.causal else "predictions"
    note = (
        f"{kind.capitalize()}-ablated {len(pairs)} head{'s' if len(pairs) > 1 else ''} ({listed}): mean {what} "
        f"{clean:.3f} → {ablated:.3f} nats ({ablated - clean:+.3f}). {len(view.changed)} of {len(tokens.ids)} top "
        f"{predictions} changed."
    )
    if tokens.note:
        note += "  \n⚠️ " + tokens.note
    return note, fig, [list(row) for row in view.changed]


def top_heads_text(store: service.ModelStore, name, text, score, previous=None):
    """"l.h, ..." of the top heads by the chosen score, for the ablation box, and the cache."""
    model = store.get(name)
    score = service.check_score(model, score)
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    cache = service.heads_cache(previous, name, tokens)
    table = service.head_scores(model, cache)[score]
    return service.format_heads(service.top_heads(table, score)), cache


def sweep_view(store: service.ModelStore, name, text, kind, score, previous=None, progress=None):
    """Yields (note, figure, cache) as the sweep goes, then the loss-increase map beside the chosen score's map;
    the body of the `ablation_sweep` endpoint. progress(fraction, message) follows the heads done."""
    model = store.get(name)
    reason = service.lm_head_reason(model, "The sweep")
    if reason:
        yield reason, plots.empty_figure(reason), previous
        return
    kind = service.check_ablation(kind)
    score = service.check_score(model, score)
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    cache = service.heads_cache(previous, name, tokens)
    ids = tokens.ids[: service.MAX_SWEEP_TOKENS]
    if len(ids) < service.loss_tokens(model):
        raise UserError("The sweep needs at least 2 tokens: there is no next token to predict in one.")
    seconds = None
    if kind not in cache.sweeps:
        for update in service.stream_sweep(model, ids, kind):
            message = f"{update.done} of {update.total} heads ablated"
            if progress is not None:
                progress(update.done / update.total, message)
            if update.increase is None:
                yield f"Sweeping: {message} ({update.seconds:.0f} s)…", plots.empty_figure(message), cache
            else:
                cache.sweeps[kind], seconds = update.increase, update.seconds
    increase = cache.sweeps[kind]
    table = service.sweep_scores(model, cache, service.MAX_SWEEP_TOKENS)[score]
    rho = service.rank_correlation(increase, table)
    label = SCORE_LABELS[score]
    fig = plots.paired_head_maps(
        service.to_numpy(increase),
        service.to_numpy(table),
        ("loss increase when the head alone is removed", f"{label} score" + (" (probe)" if score == "induction"
                                                                             else "")),
        ("Δ loss (nats)", label),
        f"Every head ablated alone ({kind}) on the first {len(ids)} tokens, beside the {label} score: "
        f"Spearman's ρ = {rho:+.2f}",
    )
    worst = ", ".join(f"{layer}.{head} ({value:+.3f})" for layer, head, value in service.top_heads(increase, "loss"))
    timing = "kept from the last run" if seconds is None else f"in {seconds:.1f} s"
    cut = f" (the text's first {len(ids)} tokens: the sweep's limit)" if len(tokens.ids) > len(ids) else ""
    note = (
        f"Swept {model.config.n_layers * model.config.n_heads} heads on {len(ids)} tokens{cut}, {timing}. "
        f"Largest loss increases: {worst}.  \n"
        f"Is the head the attention map points at the one the output depends on? Spearman's rank correlation "
        f"between the {label} score and the loss increase: **ρ = {rho:+.2f}** "
        "(1: the score ranks heads exactly as their importance does; 0: it says nothing about it)."
    )
    if score == "entropy":
        note += " For entropy, a negative ρ means the focused (low-entropy) heads matter more."
    yield note, fig, cache


ATTRIBUTION_VIEWS = ("head", "head mean", "rollout", "gradient × input", "integrated gradients")


def attribution_view(store: service.ModelStore, name, text, position, layer, head, steps, previous=None,
                     progress=None):
    """Attention, rollout and gradients for one prediction; the body of the `attribute` endpoint.
    Returns (note, chart, correlation table, cache)."""
    model = store.get(name, progress)
    reason = service.lm_head_reason(model, "Attribution")
    if reason:
        return reason, plots.empty_figure(reason), empty_table(), previous
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    cache = service.heads_cache(previous, name, tokens)
    started = time.perf_counter()
    result = service.attribution(model, cache, position, layer, head, steps)
    seconds = time.perf_counter() - started
    p, (layer, head, steps) = result.position, cache.attribution[0][1:]
    labels = tokens.labels[: len(result.head)]
    target = service.token_texts(model, [result.target])[0]
    series = {
        f"head {layer}.{head} attention": result.head,
        f"mean of layer {layer}'s heads": result.head_mean,
        "attention rollout": result.rollout,
        "gradient × input": result.grad_input,
        "integrated gradients": result.integrated,
    }
    what = "next token" if model.config.causal else "token at that position (masked-LM head)"
    fig = plots.attribution_figure(
        labels, {k: service.to_numpy(v) for k, v in series.items()},
        f"Which inputs does the prediction of {target!r} at position {p} depend on? (each view / its largest |value|)",
    )
    correlations = result.correlations()
    rows = [[row] + [round(correlations[row][col], 3) for col in ATTRIBUTION_VIEWS] for row in ATTRIBUTION_VIEWS]
    error, difference = result.completeness_error, result.logit_difference
    share = error / abs(difference) if difference else float("inf")
    relative = f"{share:.0%} of the difference" if share < 2 else f"{share:,.0f}× the difference"
    total = float(result.integrated.sum())
    notes = [
        f"Position {p} ({tokens.labels[p]}): the model's top {what} is **{target!r}**; "
        f"explained over {len(labels)} input tokens in {seconds:.1f} s.",
        f"Integrated gradients, {steps} steps from a baseline of padding tokens: Σ attributions = {total:.3f} against "
        f"logit(text) − logit(baseline) = {difference:.3f}, a completeness error of **{error:.3f}** "
        f"({relative}).",
    ]
    if share > 0.1:
        notes.append(
            f"⚠️ Not converged: more steps usually shrink the error (at most {service.MAX_IG_STEPS}, and "
            f"steps × tokens ≤ {service.MAX_IG_TOKEN_STEPS:,}); a sharp change along the path can need many."
        )
    notes.append(
        f"{NOT_EXPLANATION} Here head {layer}.{head}'s weights and integrated gradients rank the inputs with "
        f"ρ = {correlations['head']['integrated gradients']:+.2f}, the layer's mean with "
        f"ρ = {correlations['head mean']['integrated gradients']:+.2f}, rollout with "
        f"ρ = {correlations['rollout']['integrated gradients']:+.2f}."
    )
    if tokens.note:
        notes.append("⚠️ " + tokens.note)
    return "  \n".join(notes), fig, rows, cache


def lens_view(store: service.ModelStore, name, text, previous=None, progress=None):
    """The logit lens; the body of the `logit_lens` endpoint. Returns (note, figure, cache)."""
    model = store.get(name, progress)
    reason = service.lm_head_reason(model, "The logit lens")
    if reason:
        return reason, plots.empty_figure(reason), previous
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    cache = service.heads_cache(previous, name, tokens)
    table = service.logit_lens(model, cache)
    top = service.to_numpy(table.top).astype(np.int64)
    texts = service.token_grid(model, top)
    settles = table.settles.tolist()
    n_layers = top.shape[0]
    fig = plots.lens_figure(
        service.to_numpy(table.final_prob), texts, service.to_numpy(table.top_prob), tokens.labels, settles,
        "Logit lens: each layer's stream read as a prediction, coloured by P(the final answer)",
    )
    late = sum(1 for s in settles if s == n_layers - 1)
    what = "next token" if model.config.causal else "token at that position"
    note = (
        f"Row i reads the residual stream after layer i through the final norm and the LM head as a prediction of "
        f"the {what}; the last row is the model's output. Colour: the probability that layer gives the final "
        f"answer; hover: the layer's own top token. Diamonds: the first layer from which the final answer stays "
        f"top-1, on average layer **{np.mean(settles):.1f}** of {n_layers - 1}; {late} of {len(settles)} positions "
        "settle only in the last layer."
    )
    if tokens.note:
        note += "  \n⚠️ " + tokens.note
    return note, fig, cache


def surprisal_view(store: service.ModelStore, name, text, previous=None, progress=None):
    """The text shaded by loss; the body of the `surprisal` endpoint. Returns (stats, html, cache)."""
    model = store.get(name, progress)
    reason = service.next_token_reason(model, "Surprisal")
    if reason:
        return reason, "", previous
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    cache = service.heads_cache(previous, name, tokens)
    result = service.token_surprisal(model, cache)
    loss = service.to_numpy(result.loss)
    alternatives = service.alternatives(model, result)
    page = plots.surprisal_html(service.token_pieces(model, tokens.ids), loss, alternatives)
    worst = np.argsort(-loss)[:3]
    stats = (
        f"**{len(loss)} predicted tokens**: total loss {loss.sum():.2f} nats, mean **{result.mean:.3f}** nats per "
        f"token, perplexity **{result.perplexity:.2f}** (e^mean). Most surprising: "
        + ", ".join(f"{tokens.labels[i + 1]} ({loss[i]:.2f} nats)" for i in worst)
        + "."
    )
    if tokens.note:
        stats += "  \n⚠️ " + tokens.note
    return stats, page, cache


SURPRISAL_CSS = """
.surprisal { white-space: pre-wrap; line-height: 1.9; }
.surprisal .tok { border-radius: 3px; padding: 1px 0; cursor: help; }
.surprisal-legend { font-size: 0.85em; opacity: 0.7; margin-bottom: 0.4em; }
"""

# a click on a tile of the score map writes "layer.head" into the bridge and fires its click event
TILE_CLICK_JS = """
const onClick = (event) => {
  const point = event.points && event.points[0];
  if (!point || point.data.type !== "heatmap") return;
  props.value = `${point.x}.${point.y}`;
  trigger("click");
};
const attach = () => {
  const plot = document.querySelector("#heads-map .js-plotly-plot");
  if (plot && plot._ev && !plot._ev.listeners("plotly_click").includes(onClick)) plot.on("plotly_click", onClick);
};
new MutationObserver(attach).observe(document.body, { childList: true, subtree: true });
attach();
"""


def export_data(store: service.ModelStore, name, text, previous=None, progress=None):
    """Every score of every head as CSV (one row per layer × head); the body of the `export_heads` endpoint.
    Returns (path, note, cache)."""
    model = store.get(name, progress)
    tokens = service.encode(model, text, service.MAX_HEADS_TOKENS)
    cache = service.heads_cache(previous, name, tokens)
    scores = {key: service.to_numpy(table) for key, table in service.head_scores(model, cache).items()}
    n_layers, n_heads = next(iter(scores.values())).shape
    rows = [[layer, head, f"{layer}.{head}", *(round(float(scores[k][layer, head]), 6) for k in scores)]
            for layer in range(n_layers) for head in range(n_heads)]
    comments = [f"# {name}: every head's scores on the first {len(tokens.ids)} tokens of the text"
                + (" (induction: on the app's probe, 100 seeded random tokens repeated)" if "induction" in scores
                   else ""),
                *(f"# {k}: {SCORES[k][0]}" for k in scores)]
    body = "\n".join(comments) + "\n" + export.csv_text(rows, ["layer", "head", "layer.head", *scores])
    path = export.write(body, export.filename(name, "head-scores") + ".csv")
    return str(path), f"{n_layers * n_heads} heads × {len(scores)} scores ({', '.join(scores)}).", cache


def named_plot(value, model_name: str, view: str, layer=None, head=None):
    """A figure output with its modebar's image name (model, layer, head, view)."""
    return downloads.plot(value, export.filename(model_name, view, layer, head))


def build(store: service.ModelStore, picker: Picker, initial) -> TabControls:
    model = picker.model
    cfg = initial.config
    n_layers, n_heads = service.scored_shape(initial)
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text, _ = text_with_upload("Text", read_example("attention.txt"), "heads", lines=4)
            score = gr.Dropdown(choices=score_choices(initial), value="previous_token", label="Score",
                                elem_id="heads-score")
            run = gr.Button("Score every head", variant="primary", elem_id="heads-run")
            with gr.Row():
                layer = gr.Number(value=0, label=f"Layer (0–{n_layers - 1})", precision=0, elem_id="heads-layer",
                                  min_width=120)
                head = gr.Number(value=0, label=f"Head (0–{n_heads - 1})", precision=0, elem_id="heads-head",
                                 min_width=120)
            with gr.Row():
                open_button = gr.Button("Open this head", elem_id="heads-open", min_width=120)
                add_button = gr.Button("Add it to the ablation list", elem_id="heads-add", min_width=120)
            capabilities = gr.Markdown(model_note(initial), elem_id="heads-model-note")
            note = gr.Markdown(label="note", elem_id="heads-note")
            with gr.Accordion("Download the data", open=False, elem_id="heads-export-box"):
                export_button = gr.Button("Export every head's scores (CSV)", size="sm", elem_id="heads-export")
                export_file = downloads.file_box("heads-export-file")
                export_note = gr.Markdown(elem_id="heads-export-note")
        with gr.Column(scale=3, min_width=340):
            with gr.Row():
                score_map = gr.Plot(label="Score per layer × head (click a tile to open that head)",
                                    elem_id="heads-map", min_width=320)
                head_fig = gr.Plot(label="The chosen head on your text", elem_id="heads-head-view", min_width=320)
    with gr.Accordion("How to read this tab", open=False):
        gr.Markdown(INTRO)
    bridge = gr.HTML("", html_template="<span hidden>${value}</span>", js_on_load=TILE_CLICK_JS,
                     elem_id="heads-tile-bridge")
    with gr.Row():
        thresholds = gr.Markdown(label="named heads", elem_id="heads-named")
        top = gr.Dataframe(headers=["score", "rank", "head", "value", "named"], label="Top heads per score",
                           interactive=False, elem_id="heads-top")

    gr.Markdown(
        "### Ablation: does the output depend on these heads?\nRemove heads (their output before W^O set to zero, "
        "or to its mean over the text) and measure the loss at every token: of the next token for a decoder, of "
        "the token itself for an encoder with a masked-LM head."
    )
    with gr.Row():
        heads_box = gr.Textbox(label="Heads as layer.head, comma-separated", placeholder="e.g. 3.2, 5.0",
                               elem_id="heads-ablate-list")
        kind = gr.Radio(["zero", "mean"], value="zero", label="Ablation", elem_id="heads-ablation")
    with gr.Row():
        top5 = gr.Button("Top 5 by the chosen score", elem_id="heads-top5")
        ablate_button = gr.Button("Ablate", variant="primary", elem_id="heads-ablate")
        sweep_button = gr.Button("Sweep: ablate every head alone", elem_id="heads-sweep-run")
    ablation_note = gr.Markdown(label="ablation note", elem_id="heads-ablation-note")
    with gr.Row():
        loss_fig = gr.Plot(label="Loss change per token", elem_id="heads-ablation-loss")
        changed = gr.Dataframe(
            headers=["position", "token", "clean prediction", "ablated prediction", "answer in the text"],
            label="Changed predictions", interactive=False, elem_id="heads-ablation-changed",
        )
    gr.Markdown(
        f"The sweep removes each head alone, {service.SWEEP_BATCH} heads per forward pass, on the first "
        f"{service.MAX_SWEEP_TOKENS} tokens of the text, and draws the mean loss increase beside the chosen "
        "score's map."
    )
    sweep_note = gr.Markdown(label="sweep note", elem_id="heads-sweep-note")
    sweep_fig = gr.Plot(label="Loss increase beside the score", elem_id="heads-sweep-map")

    gr.Markdown(
        "### Attribution against attention, for one prediction\nFive answers to *which inputs does this prediction "
        "depend on?*: the head's attention row, the mean of its layer's heads, attention rollout through every "
        "layer, gradient × input, and integrated gradients. " + NOT_EXPLANATION
    )
    with gr.Row():
        position = gr.Number(value=-1, label="Position (−1 = the last token)", precision=0,
                             elem_id="heads-attr-position")
        attr_layer = gr.Number(value=0, label=f"Layer (0–{cfg.n_layers - 1})", precision=0,
                               elem_id="heads-attr-layer")
        attr_head = gr.Number(value=0, label=f"Head (0–{cfg.n_heads - 1})", precision=0, elem_id="heads-attr-head")
        steps = gr.Number(value=32, label=f"Integrated-gradient steps (1–{service.MAX_IG_STEPS})", precision=0,
                          elem_id="heads-attr-steps")
        attr_button = gr.Button("Attribute", variant="primary", elem_id="heads-attr-run")
    attr_note = gr.Markdown(label="attribution note", elem_id="heads-attr-note")
    attr_fig = gr.Plot(label="Four views of one prediction", elem_id="heads-attr-chart")
    correlations = gr.Dataframe(headers=["", *ATTRIBUTION_VIEWS], label="Spearman rank correlations",
                                interactive=False, elem_id="heads-attr-corr")

    gr.Markdown("### Logit lens: what each layer would predict")
    lens_button = gr.Button("Read every layer", elem_id="heads-lens-run")
    lens_note = gr.Markdown(label="lens note", elem_id="heads-lens-note")
    lens_fig = gr.Plot(label="Logit lens", elem_id="heads-lens")

    gr.Markdown("### Surprisal: how unexpected each token is")
    surprisal_button = gr.Button("Shade the text by loss", elem_id="heads-surprisal-run")
    surprisal_stats = gr.Markdown(label="surprisal stats", elem_id="heads-surprisal-stats")
    surprisal_page = gr.HTML(label="shaded text", elem_id="heads-surprisal", css_template=SURPRISAL_CSS)

    cache = gr.State(None, time_to_live=CACHE_TTL_S)
    analysis = dict(concurrency_id=ANALYSIS, concurrency_limit=ANALYSIS_LIMIT)

    @user_errors
    def head_atlas(model_name, text_value, score_name, layer_index, head_index, previous, progress=gr.Progress()):
        note_text, map_fig, table, named, head_view_fig, kept = atlas_view(
            store, model_name, text_value, score_name, layer_index, head_index, previous, progress_callback(progress))
        return (note_text, named_plot(map_fig, model_name, f"{score_name}-map"), table, named,
                named_plot(head_view_fig, model_name, "head-view", index_of(layer_index), index_of(head_index)), kept)

    atlas = dict(fn=head_atlas, inputs=[model, text, score, layer, head, cache],
                 outputs=[note, score_map, top, thresholds, head_fig, cache], **analysis)
    run.click(**atlas, api_name="head_atlas")
    score.input(**atlas, api_visibility="private")

    @user_errors
    def show_head(model_name, text_value, layer_index, head_index):
        figure = open_head(store, model_name, text_value, layer_index, head_index)
        return named_plot(figure, model_name, "head-view", index_of(layer_index), index_of(head_index))

    open_button.click(show_head, [model, text, layer, head], head_fig, api_visibility="private", **analysis)

    @user_errors
    def pick_tile(model_name, text_value, tile):
        (layer_index, head_index), *_ = service.parse_heads(tile, *service.scored_shape(store.get(model_name)))
        figure = open_head(store, model_name, text_value, layer_index, head_index)
        return layer_index, head_index, named_plot(figure, model_name, "head-view", layer_index, head_index)

    bridge.click(pick_tile, [model, text, bridge], [layer, head, head_fig], api_visibility="private", **analysis)

    @user_errors
    def add_head(listed, layer_index, head_index):
        layer_i, head_i = index_of(layer_index or 0), index_of(head_index or 0)
        if layer_i is None or head_i is None:
            raise UserError(f"Layer and head must be whole numbers to add a head, got {layer_index!r}.{head_index!r}.")
        entry = f"{layer_i}.{head_i}"
        items = [item.strip() for item in (listed or "").split(",") if item.strip()]
        return ", ".join(items if entry in items else [*items, entry])

    add_button.click(add_head, [heads_box, layer, head], heads_box, api_visibility="private", queue=False)

    @user_errors
    def ablate_heads(model_name, text_value, heads_text, ablation_kind, progress=gr.Progress()):
        note_text, figure, rows = ablation_view(store, model_name, text_value, heads_text, ablation_kind,
                                                progress_callback(progress))
        return note_text, named_plot(figure, model_name, f"ablation-{ablation_kind}"), rows

    ablate_button.click(ablate_heads, [model, text, heads_box, kind], [ablation_note, loss_fig, changed],
                        api_name="ablate_heads", **analysis)

    @user_errors
    def pick_top(model_name, text_value, score_name, previous):
        return top_heads_text(store, model_name, text_value, score_name, previous)

    top5.click(pick_top, [model, text, score, cache], [heads_box, cache], api_visibility="private", **analysis)

    @user_errors
    def ablation_sweep(model_name, text_value, ablation_kind, score_name, previous, progress=gr.Progress()):
        for note_text, figure, kept in sweep_view(store, model_name, text_value, ablation_kind, score_name, previous,
                                                  progress_callback(progress)):
            yield note_text, named_plot(figure, model_name, f"sweep-{ablation_kind}-vs-{score_name}"), kept

    sweep_button.click(ablation_sweep, [model, text, kind, score, cache], [sweep_note, sweep_fig, cache],
                       api_name="ablation_sweep", **analysis)

    @user_errors
    def attribute(model_name, text_value, position_index, layer_index, head_index, steps_value, previous,
                  progress=gr.Progress()):
        note_text, figure, table, kept = attribution_view(store, model_name, text_value, position_index, layer_index,
                                                          head_index, steps_value, previous, progress_callback(progress))
        return (note_text, named_plot(figure, model_name, f"attribution-pos{index_of(position_index)}",
                                      index_of(layer_index), index_of(head_index)), table, kept)

    attr_button.click(attribute, [model, text, position, attr_layer, attr_head, steps, cache],
                      [attr_note, attr_fig, correlations, cache], api_name="attribute", **analysis)

    @user_errors
    def logit_lens(model_name, text_value, previous, progress=gr.Progress()):
        note_text, figure, kept = lens_view(store, model_name, text_value, previous, progress_callback(progress))
        return note_text, named_plot(figure, model_name, "logit-lens"), kept

    lens_button.click(logit_lens, [model, text, cache], [lens_note, lens_fig, cache], api_name="logit_lens",
                      **analysis)

    @user_errors
    def surprisal(model_name, text_value, previous, progress=gr.Progress()):
        return surprisal_view(store, model_name, text_value, previous, progress_callback(progress))

    surprisal_button.click(surprisal, [model, text, cache], [surprisal_stats, surprisal_page, cache],
                           api_name="surprisal", **analysis)

    @user_errors
    def export_heads(model_name, text_value, previous, progress=gr.Progress()):
        return export_data(store, model_name, text_value, previous, progress_callback(progress))

    export_button.click(export_heads, [model, text, cache], [export_file, export_note, cache],
                        api_name="export_heads", **analysis)

    @user_errors
    def limits(name, layer_index, head_index):
        loaded = store.get(name)
        c = loaded.config
        scored_layers, scored_heads = service.scored_shape(loaded)
        layer_box = gr.Number(value=kept_index(layer_index, scored_layers), label=f"Layer (0–{scored_layers - 1})")
        head_box = gr.Number(value=kept_index(head_index, scored_heads), label=f"Head (0–{scored_heads - 1})")
        return (layer_box, head_box, gr.Number(value=0, label=f"Layer (0–{c.n_layers - 1})"),
                gr.Number(value=0, label=f"Head (0–{c.n_heads - 1})"),
                gr.Dropdown(choices=score_choices(loaded), value="previous_token"), model_note(loaded))

    picker.loaded.success(limits, [model, layer, head], [layer, head, attr_layer, attr_head, score, capabilities],
                          api_visibility="private")
    return TabControls(text, layer, head)
