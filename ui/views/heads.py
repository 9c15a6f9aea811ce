"""The Heads tab's views: what each head does (scores per layer × head, the induction probe), whether the output
depends on it (ablation, the sweep), which inputs one prediction depends on (attribution against attention),
what each layer would predict (the logit lens) and how surprised the model is by each token; the bodies of the
tab's endpoints. Each returns the session's HeadsCache last, for the next call: a new one, never the one it was
passed changed in place, since a result (the atlas of the default text) may be shared by every session."""

from __future__ import annotations

import time

import numpy as np

from ui.plots.base import empty_figure
from ui.plots.heads import attribution_figure, head_score_map, lens_figure, loss_change_figure, paired_head_maps
from ui.plots.text import escaped, surprisal_html
from ui.services import Services
from ui.services.checks import index_of
from ui.services.heads import (INDUCTION_LENGTH, INDUCTION_SEED, LOCAL_WINDOW, MAX_HEADS_TOKENS, MAX_SWEEP_TOKENS,
                               SCORES, ablation, added_head, alternatives, attribution, cached_lens, check_ablation,
                               check_head, check_score, completeness_table, format_heads, head_map, head_scores,
                               keep_sweep, kept_sweep, lm_head_reason, named_heads, naming_rule, next_token_reason,
                               parse_heads,
                               score_names, scored_shape, session_cache, stream_sweep, sweep_plan,
                               spearman, sweep_scores, token_surprisal, top_heads)
from ui.services.text import Encoded, encode, to_numpy, token_grid, token_pieces
from ui.views import export
from ui.views.attention import head_figure

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
NOT_EXPLANATION = (
    "A strong attention weight says where a head looked, not why the model decided anything: attention weights "
    "are not explanations. Gradients measure what the prediction is sensitive to."
)


def head_label(layer: int, head: int) -> str:
    """A head as the overviews name it: "L3 H2" (a number like 3.2 reads as a decimal)."""
    return f"L{layer} H{head}"


def score_choices(model) -> list[tuple[str, str]]:
    return [(SCORE_LABELS[name], name) for name in score_names(model)]


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
        ("ablation and the sweep", lm_head_reason(model, "Ablation")),
        ("attribution", lm_head_reason(model, "Attribution")),
        ("the logit lens", lm_head_reason(model, "The logit lens")),
        ("surprisal", next_token_reason(model, "Surprisal")),
    ):
        if reason:
            missing.append(what)
    note = f"This model is {kind}."
    if missing:
        note += f" Not available for it: {', '.join(missing)} (each section says why)."
    return note


def thresholds_markdown(model, named: dict[str, list[tuple[int, int, float]]]) -> str:
    """The heads that pass a naming threshold on this text, then the thresholds (from core.analysis.heads.SCORES):
    lists, which wrap on a phone where a four-column table does not."""
    found = []
    for name, hits in named.items():
        if not hits:
            continue
        shown = ", ".join(f"{head_label(layer, head)} ({value:.2f})" for layer, head, value in hits[:SHOWN_NAMES])
        more = f" and {len(hits) - SHOWN_NAMES} more" if len(hits) > SHOWN_NAMES else ""
        found.append(f"- **{SCORES[name][2]}s** ({len(hits)}): {shown}{more}")
    lines = ["**Named heads** (layer and head, score):",
             *(found or ["- none: no head passes a threshold on this text."]),
             "", "**How a head is named**: its score passes the threshold: a sink head's is Gu et al.'s ε, the "
             "sinks map's; the others are set so that the same model with random weights names no head.", ""]
    for name in score_names(model):
        description, _, head_name = SCORES[name]
        rule = f"{naming_rule(name)} names a *{head_name}*" if head_name is not None else "names no head"
        if name == "first_token":
            rule += " (Gu et al.'s ε, the one the sinks map rings)"
        lines.append(f"- **{SCORE_LABELS[name]}**: {description}; {rule}.")
    return "\n".join(lines)


def top_table(scores: dict, named: dict) -> list[list]:
    """Rows [score, rank, head, value, named] of the top heads per score (lowest entropy first)."""
    rows = []
    for name, table in scores.items():
        names = {(layer, head) for layer, head, _ in named.get(name, [])}
        for rank, (layer, head, value) in enumerate(top_heads(table, name), start=1):
            rows.append([SCORE_LABELS[name], rank, f"{layer}.{head}", round(value, 4),
                         SCORES[name][2] if (layer, head) in names else ""])
    return rows


def head_view(model, tokens: Encoded, layer: int, head: int):
    matrix = head_map(model, tokens.ids, layer, head)
    return head_figure(tokens, matrix, f"Layer {layer}, head {head} on your text")


def score_map_figure(name: str, table: np.ndarray, named: dict, suffix: str = ""):
    description, threshold, head_name = SCORES[name]
    title = f"{SCORE_LABELS[name]}: {description}{suffix}"
    if threshold is not None:
        title += f"<br>ringed: {naming_rule(name)}, {head_name}s"
    marked = [(layer, head) for layer, head, _ in named.get(name, [])]
    return head_score_map(table, title, SCORE_LABELS[name], zmax=1.0 if name in FRACTIONS else None,
                                marked=marked)


def atlas_view(services: Services, model_name, text_value, score_name, layer_index, head_index, previous=None,
               progress=None):
    """The chosen score's map, the top heads, the thresholds and named heads, and one head's map; the body of
    the `head_atlas` endpoint. Returns (note, map, table, thresholds, head view, cache)."""
    name, text, score, layer, head = model_name, text_value, score_name, layer_index, head_index
    model = services.models.get(name, progress)
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    score = check_score(model, score)
    layer, head = check_head(model, layer, head)
    started = time.perf_counter()
    cache = session_cache(previous, name, tokens)
    kept = cache.scores is not None
    scores = head_scores(model, cache)
    named = named_heads(scores)
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
            f"Induction probe: {INDUCTION_LENGTH} random tokens (seed {INDUCTION_SEED}), then the "
            f"same {INDUCTION_LENGTH} again. Next-token loss on the first copy **{probe.loss_first:.2f}** "
            f"nats, on the second **{probe.loss_second:.2f}** nats: the second copy can only be predicted by "
            "looking back at the first, which is what induction heads do."
        )
    if model.config.is_encoder_decoder or not model.config.causal:
        notes.append(model_note(model))
    suffix = " (on the probe)" if score == "induction" else ""
    map_fig = score_map_figure(score, to_numpy(scores[score]), named, suffix)
    return (
        "  \n".join(notes),
        export.named(map_fig, export.filename(name, f"{score}-map")),
        top_table(scores, named),
        thresholds_markdown(model, named),
        export.named(head_view(model, tokens, layer, head), export.filename(name, "head-view", layer, head)),
        cache,
    )


def open_head(services: Services, model_name, text_value, layer_index, head_index):
    """One head's map on the text, from the layer/head inputs."""
    name, text, layer, head = model_name, text_value, layer_index, head_index
    model = services.models.get(name)
    layer, head = check_head(model, layer, head)
    figure = head_view(model, encode(model, text, MAX_HEADS_TOKENS), layer, head)
    return export.named(figure, export.filename(name, "head-view", layer, head))


def empty_table() -> list[list]:
    return []


def ablation_view(services: Services, model_name, text_value, heads_text, ablation_kind, progress=None):
    """Loss change per token and the changed predictions; the body of the `ablate_heads` endpoint."""
    name, text, kind = model_name, text_value, ablation_kind
    model = services.models.get(name, progress)
    reason = lm_head_reason(model, "Ablation")
    if reason:
        return reason, export.named(empty_figure(reason), export.filename(name, f"ablation-{kind}")), empty_table()
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    pairs = parse_heads(heads_text, *scored_shape(model))
    view = ablation(model, tokens, pairs, kind)
    clean, ablated = float(view.clean_loss.mean()), float(view.ablated_loss.mean())
    listed = format_heads(pairs)
    what = "next-token loss" if model.config.causal else "loss on each token from its own position (masked-LM head)"
    fig = loss_change_figure(
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
    return note, export.named(fig, export.filename(name, f"ablation-{kind}")), [list(row) for row in view.changed]


def top_heads_text(services: Services, model_name, text_value, score_name, previous=None):
    """"l.h, ..." of the top heads by the chosen score, for the ablation box, and the cache."""
    name, text, score = model_name, text_value, score_name
    model = services.models.get(name)
    score = check_score(model, score)
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    cache = session_cache(previous, name, tokens)
    table = head_scores(model, cache)[score]
    return format_heads(top_heads(table, score)), cache


def sweep_view(services: Services, model_name, text_value, ablation_kind, score_name, previous=None, progress=None):
    """Yields (note, figure, cache) as the sweep goes, then the loss-increase map beside the chosen score's map;
    the body of the `ablation_sweep` endpoint. progress(fraction, message) follows the heads done."""
    name, text, kind, score = model_name, text_value, ablation_kind, score_name
    model = services.models.get(name)
    reason = lm_head_reason(model, "The sweep")
    if reason:
        yield reason, export.named(empty_figure(reason), export.filename(name, f"sweep-{kind}-vs-{score}")), previous
        return
    kind = check_ablation(kind)
    score = check_score(model, score)
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    cache = session_cache(previous, name, tokens)
    plan = sweep_plan(model, cache, score)
    seconds, increase = None, kept_sweep(cache, plan, kind)
    if increase is None:
        for update in stream_sweep(model, plan.ids, kind):
            message = f"{update.done} of {update.total} heads ablated"
            if progress is not None:
                progress(update.done / update.total, message)
            if update.increase is None:
                waiting = export.named(empty_figure(message), export.filename(name, f"sweep-{kind}-vs-{score}"))
                yield f"Sweeping: {message} ({update.seconds:.0f} s)…", waiting, cache
            else:
                increase, seconds = update.increase, update.seconds
                keep_sweep(cache, plan, kind, increase)
    table = sweep_scores(model, cache, MAX_SWEEP_TOKENS)[score]
    rho = spearman(increase, table)
    label, n = SCORE_LABELS[score], len(plan.ids)
    # both maps name the tokens they were measured on: the same ones, the probe or the text's start
    if plan.on_probe:
        measured_on = (f"the induction probe ({n} tokens: {INDUCTION_LENGTH} seeded random tokens, then the same "
                       "again), not your text")
        where = "on the probe"
    else:
        measured_on = f"the first {n} tokens of your text" if plan.text_tokens > n else f"your text ({n} tokens)"
        where = f"on your text's first {n} tokens" if plan.text_tokens > n else "on your text"
    fig = paired_head_maps(
        to_numpy(increase),
        to_numpy(table),
        (f"loss increase when the head alone is removed, {where}", f"{label} score, {where}"),
        ("Δ loss (nats)", label),
        f"Every head ablated alone ({kind}), beside the {label} score, both measured on {measured_on}: "
        f"Spearman's ρ = {rho:+.2f}",
    )
    worst = ", ".join(f"{head_label(layer, head)} ({value:+.3f})" for layer, head, value in top_heads(increase, "loss"))
    timing = "kept from the last run" if seconds is None else f"in {seconds:.1f} s"
    if plan.on_probe:
        what = (f"{n} tokens of the induction probe ({INDUCTION_LENGTH} seeded random tokens, then the same again), "
                "not your text: the induction score is measured there, where a head that copies has something to "
                "copy, so the loss it is compared with is measured there too")
    else:
        cut = plan.text_tokens > n
        what = f"{n} tokens" + (f" (the text's first {n} tokens: the sweep's limit; the scores beside it read the "
                                "same tokens)" if cut else "")
    note = (
        f"Swept {model.config.n_layers * model.config.n_heads} heads on {what}, {timing}. "
        f"Largest loss increases: {worst}.  \n"
        f"Is the head the attention map points at the one the output depends on? Spearman's rank correlation "
        f"between the {label} score and the loss increase: **ρ = {rho:+.2f}** "
        "(1: the score ranks heads exactly as their importance does; 0: it says nothing about it)."
    )
    if score == "entropy":
        note += " For entropy, a negative ρ means the focused (low-entropy) heads matter more."
    yield note, export.named(fig, export.filename(name, f"sweep-{kind}-vs-{score}")), cache
ATTRIBUTION_VIEWS = ("head", "head mean", "rollout", "gradient × input", "integrated gradients")
BASELINE_CHOICES = [  # (label, value): integrated gradients' starting points, core.analysis.heads.BASELINES
    ("padding token (else end-of-text, else the mean row)", "pad"),
    ("mean embedding row", "mean"),
    ("all zeros", "zero"),
]


def attribution_view(services: Services, model_name, text_value, position_index, layer_index, head_index,
                     steps_value, target_text="", foil_text="", baseline_name="pad", previous=None, progress=None):
    """Attention, rollout and gradients for one prediction (of logit(target), or logit(target) − logit(foil)),
    and the completeness error measured at several step counts; the body of the `attribute` endpoint.
    Returns (note, chart, correlation table, cache)."""
    name, text, position, layer, head, steps = (model_name, text_value, position_index, layer_index, head_index,
                                                steps_value)
    model = services.models.get(name, progress)
    reason = lm_head_reason(model, "Attribution")
    if reason:
        image = export.filename(name, f"attribution-pos{index_of(position)}", index_of(layer), index_of(head))
        return reason, export.named(empty_figure(reason), image), empty_table(), previous
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    cache = session_cache(previous, name, tokens)
    started = time.perf_counter()
    result = attribution(model, cache, position, layer, head, steps, target_text, foil_text, baseline_name)
    table = completeness_table(model, cache, result)
    seconds = time.perf_counter() - started
    chosen = cache.attribution[0]
    p, layer, head = result.position, chosen.layer, chosen.head
    labels = tokens.labels[: len(result.head)]
    target = token_pieces(model, [result.target])[0]  # its own text, a leading space kept, as typed in the boxes
    foil = token_pieces(model, [result.foil])[0] if result.foil is not None else None
    series = {
        f"head {layer}.{head} attention": result.head,
        f"mean of layer {layer}'s heads": result.head_mean,
        "attention rollout": result.rollout,
        "gradient × input": result.grad_input,
        "integrated gradients": result.integrated,
    }
    rather = f" rather than {foil!r}" if foil is not None else ""
    fig = attribution_figure(
        labels, {k: to_numpy(v) for k, v in series.items()},
        f"Which inputs does the prediction of {target!r}{rather} at position {p} depend on? "
        "(each view / its largest |value|)",
    )
    correlations = result.correlations()
    rows = [[row] + [round(correlations[row][col], 3) for col in ATTRIBUTION_VIEWS] for row in ATTRIBUTION_VIEWS]
    what = "next token" if model.config.causal else "token at that position (masked-LM head)"
    whose = f"the model's top {what}" if chosen.target is None else f"the {what} you chose"
    quoted_target, quoted_foil = escaped(repr(target)), escaped(repr(foil))
    explained = f"logit({quoted_target})" + (f" − logit({quoted_foil})" if foil is not None else "")
    notes = [
        f"Position {p} ({escaped(tokens.labels[p])}): explaining **{explained}**: {quoted_target} is {whose}"
        + (f", {quoted_foil} the foil you chose" if foil is not None else "")
        + f". Over {len(labels)} input tokens in {seconds:.1f} s.",
        *completeness_notes(result, table),
        f"{NOT_EXPLANATION} Here head {layer}.{head}'s weights and integrated gradients rank the inputs with "
        f"ρ = {correlations['head']['integrated gradients']:+.2f}, the layer's mean with "
        f"ρ = {correlations['head mean']['integrated gradients']:+.2f}, rollout with "
        f"ρ = {correlations['rollout']['integrated gradients']:+.2f}.",
    ]
    if tokens.note:
        notes.append("⚠️ " + tokens.note)
    image = export.filename(name, f"attribution-pos{index_of(position_index)}", layer, head)
    return "  \n".join(notes), export.named(fig, image), rows, cache


def completeness_notes(result, table) -> list[str]:
    """Integrated gradients' completeness at the chosen steps, and the table of what was measured at each count."""
    error, difference, steps = result.completeness_error, result.logit_difference, result.steps
    f = "f = logit(target) − logit(foil)" if result.foil is not None else "f = logit(target)"
    baseline = {value: label for label, value in BASELINE_CHOICES}[result.baseline]
    notes = [
        f"Integrated gradients of {f}, {steps} steps from a baseline of {baseline}: Σ attributions = "
        f"{float(result.integrated.sum()):.3f} against f(text) − f(baseline) = {difference:.3f}, a completeness "
        f"error of **{error:.3f}** (error / |difference|: {relative(error, difference)})."
    ]
    if error > 0.1 * abs(difference):
        notes.append(
            f"⚠️ At {steps} steps the attributions do not add up to the difference: read them with that in mind, and "
            "see the table below for other step counts (more steps do not always bring the sum closer)."
        )
    lines = [
        f"**Completeness, measured** (Σ attributions should equal f(text) − f(baseline) = {difference:.3f}):",
        "",
        "| steps | Σ attributions | error | error / \\|difference\\| |",
        "|---:|---:|---:|---:|",
    ]
    for row in table:
        m = row.measured
        cells = [f"{m.total:.3f}", f"{m.error:.3f}", relative(m.error, m.difference)] if m else [row.skipped, "", ""]
        lines.append(f"| {row.steps}{' (shown)' if row.steps == steps else ''} | " + " | ".join(cells) + " |")
    lines += ["", "Each error is what was measured at that count: it need not shrink as steps grow, so no count is "
                  "promised to be enough.", ""]
    return [*notes, "\n" + "\n".join(lines)]


def relative(error: float, difference: float) -> str:
    share = error / abs(difference) if difference else float("inf")
    return f"{share:.0%}" if share < 2 else f"{share:,.0f}×"


def lens_view(services: Services, model_name, text_value, previous=None, progress=None):
    """The logit lens; the body of the `logit_lens` endpoint. Returns (note, figure, cache)."""
    name, text = model_name, text_value
    model = services.models.get(name, progress)
    reason = lm_head_reason(model, "The logit lens")
    if reason:
        return reason, export.named(empty_figure(reason), export.filename(name, "logit-lens")), previous
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    cache = session_cache(previous, name, tokens)
    table = cached_lens(model, cache)
    top = to_numpy(table.top).astype(np.int64)
    texts = token_grid(model, top)
    settles = table.settles.tolist()
    n_layers = top.shape[0]
    fig = lens_figure(
        to_numpy(table.final_prob), texts, to_numpy(table.top_prob), tokens.labels, settles,
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
    return note, export.named(fig, export.filename(name, "logit-lens")), cache


def surprisal_view(services: Services, model_name, text_value, previous=None, progress=None):
    """The text shaded by loss; the body of the `surprisal` endpoint. Returns (stats, html, cache)."""
    name, text = model_name, text_value
    model = services.models.get(name, progress)
    reason = next_token_reason(model, "Surprisal")
    if reason:
        return reason, "", previous
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    cache = session_cache(previous, name, tokens)
    result = token_surprisal(model, cache)
    loss = to_numpy(result.loss)
    choices = alternatives(model, result)
    page = surprisal_html(token_pieces(model, tokens.ids), loss, choices)
    worst = np.argsort(-loss)[:3]
    stats = (
        f"**{len(loss)} predicted tokens**: total loss {loss.sum():.2f} nats, mean **{result.mean:.3f}** nats per "
        f"token, perplexity **{result.perplexity:.2f}** (e^mean). Most surprising: "
        + ", ".join(f"{escaped(tokens.labels[i + 1])} ({loss[i]:.2f} nats)" for i in worst)
        + "."
    )
    if tokens.note:
        stats += "  \n⚠️ " + tokens.note
    return stats, page, cache


def export_data(services: Services, model_name, text_value, previous=None, progress=None):
    """Every score of every head as CSV (one row per layer × head); the body of the `export_heads` endpoint.
    Returns (path, note, cache)."""
    name, text = model_name, text_value
    model = services.models.get(name, progress)
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    cache = session_cache(previous, name, tokens)
    scores = {key: to_numpy(table) for key, table in head_scores(model, cache).items()}
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


def pick_tile(services: Services, model_name, text_value, tile):
    """A click on a tile of the score map ("layer.head"): that layer and head, and its map on the text."""
    (layer, head), *_ = parse_heads(tile, *scored_shape(services.models.get(model_name)))
    return layer, head, open_head(services, model_name, text_value, layer, head)


add_head = added_head  # the ablation list with layer.head added once (the tab's "add" button)
