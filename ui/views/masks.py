"""The Masks tab's views: eq. 2.1 stage by stage for a window, then the causal mask, the padding mask and the
1/√d_k factor switched off on the loaded model; the bodies of the `mask_demo` and `export_masks` endpoints."""

from __future__ import annotations

import numpy as np

from ui.plots import attention as attention_plots
from ui.plots.base import empty_figure
from ui.plots.charts import bar_figure, line_figure
from ui.services import Services
from ui.services.attention import score_formula
from ui.services.checks import UserError, check_range, index_of, parse_head
from ui.services.masks import (MAX_MASK_TOKENS, MAX_STAGE_WINDOW, MAX_WINDOW_TOKENS, causal_effect, mask_stages,
                               own_window_check, padding_effect, qk_for_head, scaling_entropy, window_effect)
from ui.services.text import Encoded, encode
from ui.views import export
from ui.views.export import named


NOT_DRAWN = "Not computed: the note says why."   # a figure a refusal keeps empty


def stage_figures(model, tokens: Encoded, layer: int, head: int, start: int, size: int,
                  data: dict | None = None) -> list[tuple[str, object]]:
    """Eq. 2.1 for the window, one figure per stage: the causal mask on (scores, + mask, softmax), then off; each
    with its view's name ("stage-on-masked"). The score panels share one colour scale, so that on and off
    compare."""
    n = len(tokens.ids)
    start = check_range("Window start", start, 0, n - 1)
    size = check_range("Window size", size, 2, MAX_STAGE_WINDOW)
    stop = min(n, start + size)
    q, k = qk_for_head(model, tokens.ids, layer, head)
    stages = mask_stages(model, q[start:stop], k[start:stop], layer, head, start)
    labels = tokens.labels[start:stop]
    bound = attention_plots.score_bound([matrices[0] for matrices in stages.values()])
    titles = stage_titles(model.config, layer)
    figures = []
    for mask, matrices in stages.items():
        for stage, matrix in zip(attention_plots.STAGES, matrices):
            if data is not None:
                data[f"stage_{stage}_{mask.replace(' ', '_')}"] = (matrix, labels, labels, "query \\ key")
            figures.append((f"stage-{mask.split()[-1]}-{stage}", attention_plots.stage_figure(
                matrix, stage, labels, labels, f"<b>{mask}</b> · L{layer} H{head} · tokens {start}–{stop - 1}",
                bound, title=titles[stage])))
    return figures


def stage_titles(cfg, layer: int) -> dict[str, str]:
    """Each stage's title with the family's own terms: its scale, soft-cap c·tanh(S/c) and score bias, and the
    sliding window in the mask of a "sliding" layer."""
    scores = score_formula(cfg)
    if cfg.attn_softcap is not None:
        scores = f"{cfg.attn_softcap:g}·tanh({scores} / {cfg.attn_softcap:g})"
    if cfg.score_bias != "none":
        scores += " + ALiBi" if cfg.score_bias == "alibi" else " + T5 bias"
    titles = {**attention_plots.STAGE_TITLES}
    if scores != "QKᵀ/√d_k":
        titles["scores"] = f"scores {scores}"
    if cfg.layer_window(layer) is not None:
        titles["masked"] = f"+ mask M (window {cfg.sliding_window})"
    return titles


def terms_note(cfg, layer: int) -> str:
    """The terms of eq. 2.1 this layer adds, in words, for the note above the stages."""
    words = []
    if cfg.attn_scale is not None or not cfg.scale_attention:
        words.append(f"the scores are {score_formula(cfg)}, the family's own scale")
    if cfg.attn_softcap is not None:
        words.append(f"soft-capped to {cfg.attn_softcap:g}·tanh(S / {cfg.attn_softcap:g}), so they stay within "
                     f"±{cfg.attn_softcap:g}")
    if cfg.score_bias == "alibi":
        words.append("ALiBi's −m_h·(i − j) is added to them (this head's slope), so far keys score lower")
    elif cfg.score_bias == "relative":
        words.append("T5's learned bias for each bucket of j − i is added to them")
    if cfg.layer_window(layer) is not None:
        words.append(f"layer {layer} is a sliding-window layer: the mask also hides keys {cfg.sliding_window} or more "
                     "tokens back (i − j ≥ w)")
    return ("In this layer " + "; ".join(words) + ".") if words else ""


def causal_section(model, ids: list[int], data: dict | None = None):
    effect = causal_effect(model, ids)
    if effect is None:
        reason = (
            f"{model.config.family}: this checkpoint has no language-model head, so there is "
            f"no next-token loss to measure."
        )
        return empty_figure(reason), reason
    (loss_on, loss_off), (acc_on, acc_off) = effect["loss"], effect["accuracy"]
    if data is not None:
        data["causal_mask_effect"] = (np.array([[loss_on, loss_off], [acc_on, acc_off]]),
                                      ["next-token loss (nats)", "next-token accuracy"],
                                      ["causal mask on", "causal mask off"], "")
    fig = bar_figure(
        ["next-token loss (nats)", "next-token accuracy"],
        {"causal mask on": [loss_on, acc_on], "causal mask off": [loss_off, acc_off]},
        "Next-token loss and accuracy",
        "value",
        subtitle=f"on your text, {effect['predictions']} predictions",
    )
    if not model.config.causal:
        text = "This model is an encoder: it never used a causal mask, so switching it off changes nothing."
    else:
        text = (
            f"With the mask, loss {loss_on:.3f} and accuracy {acc_on:.1%}. Without it every position can also see the "
            f"token it has to predict: loss {loss_off:.3f}, accuracy {acc_off:.1%}. A model trained without the mask "
            "would learn to copy the answer and then fail when generating, where the future is not there to see."
        )
    return fig, text


def padding_section(model, text_a: str, text_b: str, data: dict | None = None):
    ids_a = encode(model, text_a, 256).ids
    ids_b = encode(model, text_b, 256).ids
    result = padding_effect(model, ids_a, ids_b)
    layers = [str(i) for i in range(len(result["results"]["padding mask on"]["pad_mass"]))]
    if data is not None:
        names = list(result["results"])
        data["padding_mass_per_layer"] = (np.stack([result["results"][n]["pad_mass"] for n in names], 1), layers,
                                          names, "layer")
    fig = bar_figure(
        layers,
        {name: r["pad_mass"] for name, r in result["results"].items()},
        "Weight on pad tokens, per layer",
        "mean weight on pad keys",
        x_title="layer",
        subtitle=f"the short text's {result['n_pad']} pad tokens, {result['side']} padding",
        mark_zeros=True,
    )
    on, off = result["results"]["padding mask on"], result["results"]["padding mask off"]
    text = (
        f"The shorter text ({result['n_real']} tokens) was padded with {result['n_pad']} pad tokens "
        f"on the {result['side']}. "
        f"Compared with running it alone, its real tokens' final outputs move by at most {on['max_change']:.1e} "
        f"(relative) with the padding mask, and by up to {off['max_change']:.3f} (mean "
        f"{off['mean_change']:.3f}) without it: "
        "the filler leaks into the results."
    )
    return fig, text


def entropy_section(model, ids: list[int], layer: int, head: int, data: dict | None = None):
    result = scaling_entropy(model, ids, layer, head)
    curves = result["curves"]
    n_layers = len(next(iter(curves.values()))["per_layer"])
    if data is not None:
        data["entropy_per_layer"] = (np.stack([np.array(c["per_layer"]) for c in curves.values()], 1),
                                     [str(i) for i in range(n_layers)], list(curves), "layer")
    fig = line_figure(
        np.arange(n_layers),
        {name: np.array(c["per_layer"]) for name, c in curves.items()},
        "Mean attention entropy per layer",
        "layer",
        "entropy (nats)",
        reference={"uniform attention": result["uniform"]},
        subtitle="lower: sharper rows, closer to one-hot",
    )
    (scaled_name, scaled), raw = next(iter(curves.items())), curves["not scaled"]
    factor = (f"the 1/√d_k factor the scores are √{result['head_dim']} ≈ {np.sqrt(result['head_dim']):.1f}"
              if scaled_name == "scaled by 1/√d_k" else f"its scale the scores are {result['factor']:.3g}")
    text = (
        f"Without {factor} times larger, "
        f"so the softmax saturates. Layer {layer}, head {head}: entropy {scaled['head']:.3f} → {raw['head']:.3f} nats, "
        f"mean largest weight per row {scaled['head_max_weight']:.3f} → {raw['head_max_weight']:.3f}."
    )
    return fig, text


def refused(refusal: UserError) -> tuple:
    """mask_view's outputs when the whole demo cannot run: the reason in the note and beside every figure, each
    figure in its stated empty state."""
    empty, words = empty_figure(NOT_DRAWN), f"⚠️ {refusal}"
    return (words, *[empty] * 6, empty, words, empty, words, empty, words)


def mask_view(services: Services, model_name, text_value, layer_index, head_index, window_start, window_size,
              longer_text, shorter_text, progress=None, data: dict | None = None):
    """Every figure of the tab; the body of the `mask_demo` endpoint: the note, the six stages of eq. 2.1 (causal
    mask on: scores, + mask, softmax; then off), then figure and note of the causal mask, the padding mask and the
    scaling. `data`, when given, receives every matrix behind them: name → (matrix, row labels, column labels,
    corner)."""
    name, text, text_a, text_b = model_name, text_value, longer_text, shorter_text
    model = services.models.get(name, progress)
    cfg = model.config
    if cfg.is_encoder_decoder:
        refusal = UserError(f"The mask demo reads decoder-only and encoder-only models; {name} is an "
                            "encoder-decoder. Pick smollm2-135m-instruct or minilm-l6.")
        if data is not None:            # an export has nothing to write: it says why
            raise refusal
        return refused(refusal)
    # layer and head: the page checks them before the run (a note under them); an API call gets the error
    layer = check_range("Layer", layer_index, 0, cfg.n_layers - 1)
    head = parse_head(head_index, cfg.n_heads, allow_mean=False)
    try:
        tokens = encode(model, text, MAX_MASK_TOKENS)
        if len(tokens.ids) < 2:
            raise UserError("The mask demo needs at least 2 tokens of text.")
    except UserError as refusal:
        if data is not None:            # an export has nothing to write: it says why
            raise
        return refused(refusal)
    try:
        stages = stage_figures(model, tokens, layer, head, window_start, window_size, data)
        stage_refusal = ""
    except UserError as refusal:        # the stages' own window: the other sections still run
        if data is not None:
            raise
        stage_refusal = f"⚠️ The stages of eq. 2.1 are not drawn: {refusal}"
        stages = [(f"stage-{mask}-{stage}", empty_figure(NOT_DRAWN))
                  for mask in ("on", "off") for stage in attention_plots.STAGES]
    causal_fig, causal_text = causal_section(model, tokens.ids, data)
    try:
        padding_fig, padding_text = padding_section(model, text_a, text_b, data)
    except UserError as refusal:        # the padding texts: a note beside their figure
        if data is not None:
            raise
        padding_fig, padding_text = empty_figure(NOT_DRAWN), f"⚠️ {refusal}"
    entropy_fig, entropy_text = entropy_section(model, tokens.ids, layer, head, data)
    note = f"⚠️ {tokens.note}" if tokens.note else f"{len(tokens.ids)} tokens."
    note = " ".join(filter(None, (stage_refusal, note, terms_note(cfg, layer))))
    return (note, *(named(fig, export.filename(name, view, layer, head)) for view, fig in stages),
            named(causal_fig, export.filename(name, "causal-mask")), causal_text,
            named(padding_fig, export.filename(name, "padding-mask")), padding_text,
            named(entropy_fig, export.filename(name, "entropy")), entropy_text)


def export_data(services: Services, model_name, text_value, layer_index, head_index, window_start, window_size,
                longer_text, shorter_text, progress=None) -> tuple[str, str]:
    """Every matrix of the tab as CSV in one .zip; the body of the `export_masks` endpoint."""
    data: dict = {}
    mask_view(services, model_name, text_value, layer_index, head_index, window_start, window_size, longer_text,
              shorter_text, progress, data)
    name, layer, head = model_name, layer_index, head_index
    files = {f"{key}.csv": export.matrix_csv(matrix, rows, cols, corner, [f"{name}: {key.replace('_', ' ')}"])
             for key, (matrix, rows, cols, corner) in data.items()}
    readme = (f"The mask demo on {name}, layer {index_of(layer)}, head {index_of(head)}:\n"
              "stage_{scores,masked,softmax}_causal_mask_{on,off}: eq. 2.1 for the window (masked cells empty: −inf)\n"
              "causal_mask_effect: next-token loss and accuracy with and without the causal mask (decoders)\n"
              "padding_mass_per_layer: weight the shorter text puts on its pad tokens, per layer\n"
              "entropy_per_layer: mean attention entropy with and without 1/sqrt(d_k)\n"
              f"The text is read up to its first {MAX_MASK_TOKENS} tokens; nothing is pooled.\n")
    path = export.write(export.zip_of(files, readme), export.filename(name, "masks", index_of(layer), index_of(head)) + ".zip")
    return str(path), f"{len(files)} matrices as CSV: {', '.join(sorted(files))}."


def own_window_words(check: dict | None, model_name: str, causal: bool = True) -> str:
    """What the loaded model's own window is, and the check that the demo's window reproduces it."""
    if check is None:
        return f"{model_name} has no window of its own: every layer reads every {'earlier ' if causal else ''}key."
    w = check["window"]
    words = (f"{model_name} has its own window of {w} keys on {check['sliding']} of its {check['layers']} layers. "
             f"The demo's mask for w = {w} is {'equal' if check['mask_equal'] else 'NOT equal'} to the family's own "
             f"on layer {check['sliding_layer']}")
    if check["full_layer"] is None:
        how = (f"; running with w = {w} on top changes that layer's weights by at most {check['max_diff']:.1e}")
    else:
        how = (f"; with w = {w}, full layer {check['full_layer']} reads exactly the keys sliding layer "
               f"{check['sliding_layer']} reads")
    verdict = ", so the demo's window is the family's own (eq. 6.5)." if check["reproduced"] and check["mask_equal"] \
        else ", so the demo's window does NOT reproduce the family's own here."
    return words + how + verdict


def cost_words(cost: dict, n: int) -> str:
    (full, windowed), (full_b, windowed_b) = cost["scores"], cost["bytes"]
    saved = 1 - windowed / full if full else 0.0
    return (f"Attention cost on these {n} tokens, counted (not timed): each layer's head computes Σ over queries of "
            f"the keys it reads; over {len(cost['per_layer']['full'])} layers × {cost['heads']} heads that is "
            f"{full:,} scores with the model's own masks and {windowed:,} with the window ({saved:.1%} fewer). "
            f"Kept as weights at {cost['itemsize']} bytes each: {full_b:,} bytes against {windowed_b:,} "
            f"(a dense T × T matrix per head would hold {cost['dense']:,}).")


def output_change_section(result: dict, model_name: str, n: int) -> tuple[object, str]:
    """What the window changed in the output: the next-token KL per position (a model with an LM head), else each
    position's relative change of its final hidden state and the cosine of the mean-pooled sentence embeddings."""
    kl = result["kl"]
    if kl is not None:
        fig = line_figure(np.arange(n), {"KL(full ‖ window)": kl}, "Next-token KL, full → window", "position",
                          "KL (nats)", reference={f"mean {kl.mean():.4f}": float(kl.mean())},
                          subtitle="0 where the window hides nothing yet")
        return fig, (f"KL from the full run's next-token distribution to the windowed run's: mean {kl.mean():.4f} "
                     f"nats over {n} positions, largest {kl.max():.4f} at position {int(kl.argmax())}.")
    change, cosine = result["change"], result["cosine"]
    fig = line_figure(np.arange(n), {"‖h_window − h‖ / ‖h‖": change}, "Output change, full → window",
                      "position", "relative change", reference={f"mean {change.mean():.4f}": float(change.mean())},
                      subtitle="each position's final hidden state")
    return fig, (f"{model_name} has no language-model head (a sentence encoder), so the window's effect is measured "
                 f"on its output: each position's final hidden state moves by ‖h_window − h‖ / ‖h‖ = "
                 f"{change.mean():.4f} on average over {n} positions, at most {change.max():.4f} at position "
                 f"{int(change.argmax())}. The sentence embedding (the mean of the final hidden states over the "
                 f"positions, as a sentence encoder pools them) with and without the window: cosine {cosine:.4f} "
                 "(1 would be the same direction).")


def window_settings(model, model_name, text_value, window_size, global_size):
    """The window demo's own inputs checked: (tokens, w, g); a UserError names the first wrong one."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        raise UserError(f"The window demo narrows one stack's self-attention, so it reads decoder-only and "
                        f"encoder-only models; {model_name} is an encoder-decoder. Pick smollm2-135m-instruct or "
                        "minilm-l6.")
    tokens = encode(model, text_value, MAX_WINDOW_TOKENS)
    if len(tokens.ids) < 2:
        raise UserError("The window demo needs at least 2 tokens of text.")
    window = check_range("Window w", window_size, 1, MAX_WINDOW_TOKENS)
    global_tokens = check_range("Global tokens g", global_size, 0, MAX_WINDOW_TOKENS)
    return tokens, window, global_tokens


def window_view(services: Services, model_name, text_value, layer_index, head_index, window_size, global_size,
                progress=None):
    """The body of the `window_mask` endpoint: the model run as loaded and with a window of w keys (plus the
    first g keys, a local + global mask) on every layer: causal on a decoder, symmetric on an encoder (Longformer's
    pattern). Returns the note, the mask, the chosen head's weights (full, windowed, difference), what the window
    changed in the output (next-token KL, or an encoder's hidden-state change), the cost per layer and the words.
    A refusal (wrong settings, an encoder-decoder) is the note, with every figure in its stated empty state."""
    model = services.models.get(model_name, progress)
    cfg = model.config
    # layer and head: the page checks them before the run (a note under them); an API call gets the error
    layer = check_range("Layer", layer_index, 0, cfg.n_layers - 1)
    head = parse_head(head_index, cfg.n_heads, allow_mean=False)
    try:
        tokens, window, global_tokens = window_settings(model, model_name, text_value, window_size, global_size)
    except UserError as refusal:
        empty = empty_figure(NOT_DRAWN)
        return f"⚠️ The window demo did not run: {refusal}", empty, empty, empty, empty, ""
    n = len(tokens.ids)
    result = window_effect(model, tokens.ids, layer, head, window, global_tokens)
    kind = f"window w = {window}" + (f" + {global_tokens} global tokens" if global_tokens else "")
    shape = "" if cfg.causal else "symmetric "
    mask_fig = attention_plots.window_mask_figure(result["mask"], result["own_mask"], f"Mask: {shape}{kind}",
                                                  f"layer {layer}; blue read, orange hidden by the window")
    weights_fig = attention_plots.window_weights_figure(*result["weights"], f"L{layer} H{head}: full vs {kind}",
                                                        readable=result["own_mask"])
    change_fig, change_words = output_change_section(result, model_name, n)
    per_layer = result["cost"]["per_layer"]
    cost_fig = bar_figure([str(i) for i in range(cfg.n_layers)], per_layer, "Scores per head, per layer",
                          "scores computed (Σ keys read)", x_title="layer", text_format=",.0f",
                          subtitle="counted from the masks, not timed")
    note = f"⚠️ {tokens.note}" if tokens.note else f"{n} tokens, {kind}."
    if not cfg.causal:
        note += (f" {model_name} is an encoder: its window is symmetric, each query reads the keys fewer than w places "
                 "away on either side" + (", and the global tokens read every key and are read by every query "
                                          "(Longformer's local + global pattern)." if global_tokens else "."))
    words = " ".join(filter(None, (change_words, cost_words(result["cost"], n),
                                   own_window_words(own_window_check(model, tokens.ids), model_name, cfg.causal))))
    return (note, named(mask_fig, export.filename(model_name, f"window-mask-L{layer}")),
            named(weights_fig, export.filename(model_name, "window-weights", layer, head)),
            named(change_fig, export.filename(model_name, "window-kl" if cfg.causal else "window-change")),
            named(cost_fig, export.filename(model_name, "window-cost")), words)
