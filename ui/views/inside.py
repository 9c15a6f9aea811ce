"""The Inside tab's views: one real forward pass, stage by stage, for one head and its layer on a short text, each
stage with its equation, its shapes, a figure of the real numbers and what to notice (measured); then why the head
attends from one token to another. The bodies of the forward_walk, score_anatomy and qk_geometry endpoints."""

from __future__ import annotations

import io

import numpy as np

from ui.plots.attention import stages_figure
from ui.plots.base import empty_figure, fit_narrow
from ui.plots.charts import with_subtitle
from ui.plots.inside import (content_position_figure, decomposition_figure, geometry_figure, next_token_figure,
                             rotation_figure, score_terms_figure, side_bars, stage_panels, token_bars)
from ui.plots.text import escaped
from ui.services import Services
from ui.services.checks import public_text
from ui.services.inside import (PLANE_DEFINITION, SIDE_TOP, anatomy_of, check_token, content_and_position, encode_walk,
                                geometry, layer_terms, measures, next_token, scale_words, sides_of, stack_config,
                                stage_arrays, walk)
from ui.services.text import check_text_size, token_pieces, token_texts
from ui.views import export

STAGE_COUNT = 8  # figures the walk draws, in order


def quoted(piece: str) -> str:
    return escaped(repr(piece))


def shapes(**named) -> str:
    return ", ".join(f"{name} [{' × '.join(str(s) for s in shape)}]" for name, shape in named.items())


def embedding_stage(stages, tokens, token, cfg) -> tuple[str, object]:
    panels = [("token embeddings", stages.embeddings.numpy(), "dimension")]
    if stages.positions is not None:
        panels.append(("positions added (eq. 4.2)", stages.positions.numpy(), "dimension"))
    fig = stage_panels(panels, tokens, "1 · Tokens and embeddings: one row per token", token)
    if stages.positions is not None:
        where = "added to each row, eq. 4.2: X = X_embed + PE"
    elif stages.rope_angles is not None:
        where = "none added here: RoPE rotates queries and keys inside each head instead (stage 4)"
    elif stages.bias_kind is not None:
        where = ("none added here: a bias on the scores says them instead "
                 f"({'ALiBi' if stages.bias_kind == 'alibi' else 'T5’s relative-position bias'}, stage 5)")
    else:
        where = "none: this model has no positions"
    note = (f"**1 · Tokens → embeddings.** Each token id picks a row of the embedding table"
            f"{f', times {cfg.embed_scale:g}' if cfg.embed_scale != 1 else ''}; positions: {where}. "
            f"Shapes: {shapes(ids=[len(tokens)], X=list(stages.embeddings.shape))}. The followed token "
            f"{quoted(tokens[token])} has id {int(stages.tokens[token])}; its row's length is "
            f"{float(stages.embeddings[token].norm()):.2f}.")
    return note, fig


def norm_stage(stages, tokens, token, cfg, m) -> tuple[str, object]:
    gain = f"({cfg.norm_offset:g} + γ)" if cfg.norm_offset else "γ"
    kind = (f"RMSNorm x / rms(x) · {gain}" if cfg.norm == "rmsnorm"
            else f"LayerNorm {gain} ⊙ (x − μ)/√(σ² + ε) + β (eq. 5.4)")
    placement = ("before attention (Pre-LN: x + f(norm(x)))" if cfg.norm_placement == "pre"
                 else "after attention and the residual (Post-LN: norm(x + f(x)), eq. 5.1); the bars are that norm's")
    if cfg.parallel_block:
        placement = ("before attention, and a second norm before the MLP, both reading the block's input "
                     "(a parallel block: x + attn(norm₁(x)) + mlp(norm₂(x)))")
    if cfg.sandwich_norm:
        placement += ("; sandwich norms also norm each sublayer's output before it joins the residual stream "
                      "(stage 6's attention output is after that norm)")
    fig = token_bars(tokens, stages.norm_scale.numpy(), f"2 · The norm's scale 1/s per token, layer {stages.layer}",
                     "1 / s", token)
    spread = stages.norm_scale.numpy()
    note = (f"**2 · Norm.** {kind}, {placement}. Shapes: {shapes(x=list(stages.resid_pre.shape))} → the same. "
            f"Each token is divided by its own s: at {quoted(tokens[token])} the scale is **{m.norm_scale:.3f}**, "
            f"across the text {spread.min():.3f}–{spread.max():.3f}, so no token's size dominates what attention "
            "reads.")
    return note, fig


def qkv_stage(stages, tokens, token, cfg) -> tuple[str, object]:
    panels = [("q", stages.q.numpy(), "d_head"), ("k", stages.k.numpy(), "d_head"), ("v", stages.v.numpy(), "d_head")]
    fig = stage_panels(panels, tokens, f"3 · Head {stages.head}'s queries, keys and values", token)
    shared = ", ".join(str(h) for h in stages.shared_heads)
    gqa = (f"Grouped-query attention: query heads {shared} all read key/value head {stages.kv_head} "
           f"({cfg.n_heads} query heads, {cfg.n_kv_heads} key/value heads), so the cache holds "
           f"{cfg.kv_group}× fewer keys and values."
           if len(stages.shared_heads) > 1 else "Every query head has its own keys and values.")
    qk_norm = (" QK-norm: each head's q and k then pass an RMSNorm over d_head (gain "
               f"{'(1 + γ)' if cfg.norm_offset else 'γ'}), before RoPE; the figure's q and k are after both."
               if cfg.qk_norm else "")
    note = (f"**3 · Q, K, V for head {stages.head}** (eq. 3.1: q = x·W_Q, k = x·W_K, v = x·W_V, per head). Shapes: "
            f"{shapes(x=list(stages.attn_in.shape), q=list(stages.q.shape), k=list(stages.k.shape))}. {gqa}{qk_norm}")
    return note, fig


def rope_stage(stages, tokens, token, cfg) -> tuple[str, object]:
    if stages.rope_angles is None:
        if stages.bias_kind == "alibi":
            text = ("No rotation here: ALiBi adds −m_h·(i − j) to the scores (stage 5), so positions never touch q "
                    "or k.")
        elif stages.bias_kind == "relative":
            text = ("No rotation here: T5 adds a learned bias per bucket of the distance j − i to the scores "
                    "(stage 5), so positions never touch q or k.")
        elif stages.positions is not None:
            text = "This model adds its positions to the embeddings (stage 1): no rotation here."
        else:
            text = "This model has no positions: no rotation here."
        return f"**4 · Positions in the head.** {text}", empty_figure(text, 160)
    angles = stages.rope_angles[token].numpy()
    rotated = 2 * len(angles)                                           # the rotated dims (partial rotary: fewer)
    before = stages.q_unrotated[token, :rotated].numpy().reshape(2, -1).T  # pair i: dimensions i and i + r/2
    after = stages.q[token, :rotated].numpy().reshape(2, -1).T
    fig = rotation_figure(angles, before, after, f"4 · RoPE on the query of {quoted(tokens[token])} (position {token})")
    kept = np.linalg.norm(before, axis=1) - np.linalg.norm(after, axis=1)
    d_head = stages.q.shape[-1]
    partial = (f" Partial rotary: only the first {rotated} of the {d_head} dims turn; the other {d_head - rotated} "
               "pass unrotated and carry no position." if rotated < d_head else "")
    base = cfg.layer_rope_theta(stages.layer)
    if cfg.local_rope(stages.layer):
        partial += (f" This sliding layer turns at its own base {base:g} (full layers: "
                    f"{cfg.rope_theta:g}).")
    norm = " With QK-norm, RoPE turns q and k after that norm." if cfg.qk_norm else ""
    note = (f"**4 · RoPE.** Each of the {len(angles)} frequency pairs of q and k turns by the angle m·θ_i, "
            f"θ_i = {base:g}^(−2i/{cfg.rotary_dim or d_head}): at position {token} the fastest pair has turned "
            f"{angles[0]:.2f} rad, the slowest {angles[-1]:.4f}. A rotation keeps each pair's length (largest change "
            f"here {np.abs(kept).max():.1e}), and q_m·k_n then depends on m − n only.{partial}{norm}")
    return note, fig


def scaled_name(cfg, scale: float) -> str:
    """QKᵀ times the layer's scale, as an equation's term."""
    if cfg.attn_scale is None and cfg.scale_attention:
        return "QKᵀ/√d_k"
    return "QKᵀ" if scale == 1 else f"QKᵀ·{scale:.4g}"


def mask_words(stages, cfg) -> str:
    """The layer's mask in words: causal or not, and the window on a sliding layer."""
    if stages.window is not None:
        i, j = np.tril_indices(len(stages.mask))
        hidden = int((~stages.mask.numpy()[i, j]).sum())                 # cells the window alone hides
        return (f" The mask is causal and, on this sliding layer, a window of {stages.window}: keys {stages.window} "
                f"or more positions back are masked too (M = −∞, grey), {hidden} cells here.")
    if cfg.sliding_window is not None and "sliding" in cfg.layer_types:
        return (f" This is a full layer: no window here (the sliding layers mask keys {cfg.sliding_window} or more "
                "back).")
    return ""


def score_terms_words(stages) -> str:
    """The soft-cap and the score bias of this layer, measured."""
    words = ""
    if stages.capped is not None:
        c = stages.softcap
        raw = float((stages.scores * stages.scale)[stages.mask].abs().max())
        words += (f" Then the soft-cap c·tanh(S/c), c = {c:g}: every score stays within ±{c:g} (the largest |S| "
                  f"here, {raw:.2f}, becomes {c * np.tanh(raw / c):.2f}); a tanh, so nothing after it is a sum.")
    if stages.bias_kind == "alibi":
        words += " Then ALiBi's position bias −m·(i − j) of this head is added"
        if len(stages.bias) > 1:   # query 1, key 0: −m
            slope = -float(stages.bias[1, 0])
            words += f", m = {slope:.4g}: a key d tokens back loses {slope:.3g}·d"
        words += "."
    elif stages.bias_kind == "relative":
        seen = stages.bias[stages.mask]
        words += (f" Then T5's relative-position bias of this head is added (a learned value per bucket of j − i): "
                  f"from {float(seen.min()):+.2f} to {float(seen.max()):+.2f} over the cells here.")
    return words


def score_stage(stages, tokens, token, cfg, m) -> tuple[str, object]:
    scaled = (stages.scores * stages.scale).numpy()
    masked = np.where(stages.mask.numpy(), stages.scored.numpy(), -np.inf)
    labels = [f"{i} {t}" for i, t in enumerate(tokens)]
    name = scaled_name(cfg, stages.scale)
    terms = ("" if stages.capped is None else ", the cap") + ("" if stages.bias is None else ", the bias")
    title = f"5 · {name}{terms}, the mask, the softmax (click a cell: why this weight?)"
    if stages.capped is None and stages.bias is None and stages.window is None:
        fig = stages_figure({f"head {stages.head}": (scaled, masked, stages.probs.numpy())}, labels, labels, title)
    else:
        panels = [(f"scores {name}", scaled, "score")]
        if stages.capped is not None:
            panels.append((f"soft-cap {stages.softcap:g}·tanh(S/{stages.softcap:g})", stages.capped.numpy(), "score"))
        if stages.bias is not None:
            panels.append(("+ ALiBi bias −m(i − j)" if stages.bias_kind == "alibi" else "+ T5 relative bias",
                           stages.bias.numpy(), "bias"))
        window = "" if stages.window is None else f" (window {stages.window})"
        panels += [(f"+ mask M{window}", masked, "score"), ("softmax → weights", stages.probs.numpy(), "weights")]
        fig = score_terms_figure(panels, labels, title)
    row = stages.probs[token].numpy()
    top = int(row.argmax())
    scale = (f"scaled by {scale_words(cfg, stages.scale)} it is **{m.scaled_variance:.2f}**. Without the scale the "
             f"rows' mean entropy would fall from {m.entropy:.2f} to {m.entropy_unscaled:.2f} nats (sharper, closer "
             "to one-hot)" if stages.scale != 1 else
             "this family applies no scale: its weights are trained without 1/√d_k")
    inner = name if stages.softcap is None else f"c·tanh({name}/c)"
    eq = f"softmax({inner}{' + B' if stages.bias is not None else ''} + M)"
    note = (f"**5 · Scores → weights** (eq. 2.1 as this layer computes it: {eq}). Shapes: "
            f"{shapes(S=list(stages.scores.shape))}. The variance of q·k over this head's cells is "
            f"**{m.qk_variance:.1f}** with d_k = {m.d_head}; {scale}.{score_terms_words(stages)}"
            f"{mask_words(stages, cfg)} {quoted(tokens[token])} puts {row[top]:.2f} of its weight on "
            f"{quoted(tokens[top])}.")
    return note, fig


def output_stage(stages, tokens, token, m) -> tuple[str, object]:
    panels = [(f"z of head {stages.head} = weights · v", stages.z.numpy(), "d_head"),
              ("the layer's attention output (all heads · W^O)", stages.attn_out.numpy(), "dimension")]
    fig = stage_panels(panels, tokens, "6 · The head's output and the layer's, before the residual", token)
    note = (f"**6 · Weights · V, heads concatenated, W^O, residual** (eq. 3.1). Shapes: "
            f"{shapes(z=list(stages.z.shape), out=list(stages.attn_out.shape))}. At {quoted(tokens[token])} the "
            f"attention output is **{100 * m.attn_share:.0f} %** of the residual stream's length: each layer "
            "adds a correction, and the residual carries the rest on.")
    return note, fig


def mlp_stage(stages, tokens, token, cfg, m) -> tuple[str, object]:
    if stages.mlp_gate is not None:
        panels = [("act(gate)", stages.mlp_gate.numpy(), "d_ff"), ("up", stages.mlp_up.numpy(), "d_ff"),
                  ("act(gate) ⊙ up", stages.mlp_hidden.numpy(), "d_ff")]
        what = (f"SwiGLU: down(SiLU(x·W_gate) ⊙ x·W_up). **{100 * m.gate_closed:.0f} %** of the gate's values are "
                "near zero (|act| < 0.05): the gate decides which features pass.")
    else:
        panels = [("up", stages.mlp_up.numpy(), "d_ff"), ("act(up)", stages.mlp_hidden.numpy(), "d_ff")]
        what = "FFN(x) = act(x·W₁ + b₁)·W₂ + b₂ (eq. 5.3), the same for every token."
    fig = stage_panels(panels, tokens, "7 · The feed-forward network, token by token", token)
    note = (f"**7 · Feed-forward.** {what} Shapes: {shapes(x=list(stages.mlp_in.shape), hidden=list(stages.mlp_hidden.shape))}"
            f" → [{stages.mlp_out.shape[0]} × {stages.mlp_out.shape[1]}]. At {quoted(tokens[token])} its output is "
            f"{100 * m.mlp_share:.0f} % of the residual's length.")
    return note, fig


def logits_stage(model, stages, tokens, token, temperature, top_k, top_p) -> tuple[str, object]:
    nxt = next_token(model, stages, token, temperature, top_k, top_p)
    if nxt is None:
        text = "This model has no LM head here: the walk ends at the stack's output."
        return f"**8 · Logits.** {text}", empty_figure(text, 160)
    names = token_texts(model, nxt.ids)
    fig = next_token_figure(names, nxt.probs, nxt.kept,
                            f"8 · After {quoted(tokens[token])}: the next token at temperature {nxt.temperature:g}")
    greedy = "temperature 0 is greedy: the top token only" if nxt.temperature == 0 else \
        f"{nxt.kept_count:,} tokens survive top-k and top-p, holding **{100 * nxt.kept_mass:.1f} %** of the probability"
    note = (f"**8 · Final norm, logits, sampling.** The last residual stream, normed, times the unembedding: "
            f"{shapes(logits=list(stages.logits.shape))}. Softmax(logits / T); {greedy}; the most likely is "
            f"{quoted(names[0])} at {nxt.probs[0]:.3f}.")
    return note, fig


def walk_stages(model, tokens_enc, layer_index, head_index, token_index, temperature_value, top_k_value,
                top_p_value):
    """(stages, the followed token, a line naming this layer's attention terms, then a (note, figure) per stage)
    for one encoded text: the walk without the page's export."""
    stages = walk(model, tokens_enc, layer_index, head_index)
    token = check_token(tokens_enc, token_index)
    tokens = token_texts(model, tokens_enc.ids)
    cfg = stack_config(model)
    m = measures(stages, token)
    parts = [embedding_stage(stages, tokens, token, cfg), norm_stage(stages, tokens, token, cfg, m),
             qkv_stage(stages, tokens, token, cfg), rope_stage(stages, tokens, token, cfg),
             score_stage(stages, tokens, token, cfg, m), output_stage(stages, tokens, token, m),
             mlp_stage(stages, tokens, token, cfg, m),
             logits_stage(model, stages, tokens, token, temperature_value, top_k_value, top_p_value)]
    terms = (f"This {stages.layer_type} layer's attention has: {escaped('; '.join(layer_terms(cfg, stages)))}.")
    return stages, token, terms, parts


def walk_view(services: Services, model_name, text_value, layer_index, head_index, token_index, temperature_value,
              top_k_value, top_p_value, progress=None):
    """(note, then a note and a figure per stage, then the .npz of every stage); the body of forward_walk."""
    name = model_name
    model = services.models.get(name, progress)
    tokens_enc = encode_walk(model, text_value)
    stages, token, terms, parts = walk_stages(model, tokens_enc, layer_index, head_index, token_index,
                                              temperature_value, top_k_value, top_p_value)
    tokens = token_texts(model, tokens_enc.ids)
    base = export.filename(name, "inside", stages.layer, stages.head)
    outputs = []
    for i, (note, fig) in enumerate(parts, start=1):
        outputs += [note, export.named(fig, f"{base}_stage{i}")]
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **stage_arrays(stages), token_pieces=np.array(token_pieces(model, tokens_enc.ids)))
    file = export.write(buffer.getvalue(), base + ".npz")
    head = (f"{len(tokens)} tokens through layer {stages.layer}, head {stages.head} of {escaped(public_text(name))}, following "
            f"{quoted(tokens[token])} (position {token}). Every number below is this pass's own.  \n{terms}")
    if tokens_enc.note:
        head += f"  \n{escaped(tokens_enc.note)}"
    return (head, *outputs, str(file))


def score_words(result) -> str:
    """The score's stages after its parts, in words: the soft-cap and the score bias, each its own stage."""
    words = ""
    if result.capped is not None:
        words += (f" The parts add up to the value before the cap. The soft-cap c·tanh(S/c), c = {result.softcap:g}, "
                  f"is a tanh, so no part maps through it linearly: it is its own stage, turning {result.score:+.3f} "
                  f"into **{result.capped:+.3f}**.")
    if result.bias_term is not None:
        words += (f" Then the {escaped(result.bias_label)} adds **{result.bias_term:+.3f}**, a part of its own: in "
                  "this family it carries the positions (the residual stream has no positions part).")
    if words:
        words += f" Softmax reads **{result.scored:+.3f}** here, before the mask."
    return words


def later_stages(result) -> list[tuple[str, float, str]]:
    """The score's stages after the sum of its parts, for the waterfall beside them (none without a cap or bias)."""
    if result.capped is None and result.bias_term is None:
        return []
    stages = [("sum of the parts", result.score, "absolute")]
    if result.capped is not None:
        stages.append((f"soft-cap {result.softcap:g}·tanh(S/{result.softcap:g})", result.capped - result.score,
                       "relative"))
    if result.bias_term is not None:
        stages.append((result.bias_label, result.bias_term, "relative"))
    return stages + [("what softmax reads", result.scored, "total")]


def anatomy_titles(query: str, key: str, score: float, before: str, split: str, relative: bool,
                   shape: tuple[int, int]) -> tuple[str, str]:
    """The decomposition figure's title, naming the query's and the key's tokens and the score, and its subtitle,
    saying what the score is measured against and how it is split."""
    title = f"Why {quoted(query)} → {quoted(key)}: {'relative score' if relative else 'score'}{before} {score:+.3f}"
    against = "against the query's attention-weighted mean key; " if relative else ""
    split_words = ("by side, every earlier head its own part" if split == "heads"
                   else f"a sum over {pairs_words(shape)}")
    return title, against + split_words


def pairs_words(shape: tuple[int, int]) -> str:
    """How many parts a score is split into, as a student reads it: '33,124 pairs (182 query-side parts ×
    182 key-side parts)'."""
    queries, keys = shape
    return f"{queries * keys:,} pairs ({queries:,} query-side parts × {keys:,} key-side parts)"


def anatomy_parts(model, tokens_enc, layer_index, head_index, query_index, key_index, split="layers",
                  relative=False):
    """(decomposition, note, decomposition figure, content-against-position figure) for one encoded text. split:
    each earlier layer's attention as one part ("layers", a heatmap of query part × key part) or its heads one by
    one ("heads", each side's largest parts as bars); relative: the score against the query's mean key."""
    result = anatomy_of(model, tokens_enc, layer_index, head_index, query_index, key_index, split, relative)
    stages = walk(model, tokens_enc, result.layer, result.head)
    tokens = token_texts(model, tokens_enc.ids)
    cfg = stack_config(model)
    q, k = result.query, result.key
    matrix = result.matrix.numpy()
    order = np.argsort(-np.abs(matrix), axis=None)[:3]
    largest = "; ".join(f"query side: {escaped(result.query_labels[i // matrix.shape[1]])}, key side: "
                        f"{escaped(result.key_labels[i % matrix.shape[1]])} ({matrix.flat[i]:+.2f})" for i in order)
    before = " before the cap" if result.capped is not None else ""
    title, subtitle = anatomy_titles(tokens[q], tokens[k], result.score, before, split, relative, matrix.shape)
    if split == "heads":
        fig = side_bars(*sides_of(result), title)
    else:
        fig = decomposition_figure(matrix, result.query_labels, result.key_labels, title,
                                   after=[] if relative else later_stages(result))
    fig = fit_narrow(with_subtitle(fig, subtitle))   # wrapped to the plot's width, a phone's too
    series = content_and_position(model, tokens_enc, stages, q)
    line = content_position_figure(tokens, series, q, f"Every key of {quoted(tokens[q])}, layer {result.layer}, "
                                                      f"head {result.head}")
    masked = "" if result.allowed else " The mask hides this key from this query, so its weight is 0 whatever the score."
    extra = ""
    if relative:
        extra = (f" The plain score q·k·scale{before} of this pair is {result.pair_score:+.3f}; with the later terms, "
                 f"softmax compares **{result.relative_scored:+.3f}** (the log of this key's weight against the "
                 "query's weighted mean log-weight).")
    elif result.unrotated_score is not None:
        extra = (f" Without the rotation the same q and k give {result.unrotated_score:+.3f}: RoPE (position) adds "
                 f"{result.score - result.unrotated_score:+.3f}.")
    elif result.terms:
        extra = " " + ", ".join(f"{escaped(t)} {v:+.3f}" for t, v in result.terms.items()) + "."
    frozen = "every norm, the QK-norm included," if cfg.qk_norm else "every norm"
    scaled = (f"scaled score q·k·scale{before} (scale {scale_words(cfg, stages.scale)})" if stages.scale != 1
              else f"score q·k{before} (this family applies no scale)")
    scaled = (f"Softmax reads only differences between a query's scores, so this splits score(i, j) − Σ_k a_ik·"
              f"score(i, k): the {scaled} of this key against the query's attention-weighted mean over its keys"
              if relative else f"The {scaled}")
    parts = ("each earlier layer's heads one by one (z·W_O of each) beside its MLP, the embeddings and the biases"
             if split == "heads" else "what each side's residual stream is made of")
    sides = (" The figure sums the pairs by side: each query-side part against the whole key, and the whole query "
             f"against each key-side part, the {SIDE_TOP} largest of each named." if split == "heads" else "")
    note = (f"{scaled} from {quoted(tokens[q])} (query {q}) to {quoted(tokens[k])} (key {k}) is "
            f"**{result.score:+.3f}**. Written as a sum over {parts} ({frozen} frozen at its value on this text), the "
            f"{pairs_words(matrix.shape)} add up to **{matrix.sum():+.3f}**. Largest: {largest}.{sides}{extra}"
            f"{'' if relative else score_words(result)}{masked}")
    return result, note, fig, line


def anatomy_view(services: Services, model_name, text_value, layer_index, head_index, query_index, key_index,
                 split="layers", relative=False, progress=None):
    """(note, decomposition figure, content against position): why the head weighs `key` from `query`, split by
    layers or by heads, plainly or against the query's mean key; the body of score_anatomy."""
    name = model_name
    model = services.models.get(name, progress)
    tokens_enc = encode_walk(model, text_value)
    result, note, fig, line = anatomy_parts(model, tokens_enc, layer_index, head_index, query_index, key_index,
                                            split, relative)
    return note, export.named(fig, export.filename(name, "score-anatomy", result.layer, result.head)), \
        export.named(line, export.filename(name, "content-position", result.layer, result.head))


def qk_attribution_data(services: Services, model_name, text_value, layer_index, head_index, query_index,
                        key_index, split="heads", relative=False) -> dict:
    """The score from `query` to `key` split into pairs (query part, key part), as numbers: the body of the
    `qk_attribution` endpoint (API only). split "heads": every earlier head one part ("L3 H5"), "layers": each
    earlier layer's attention one part; relative: score(i, j) − Σ_k a_ik·score(i, k), the score against the
    query's attention-weighted mean key. matrix[a][b] is query part a with key part b; it adds up to score.
    "read" says how many of the text's tokens were read (the tab's first MAX_INSIDE_TOKENS): an API call has no
    text field, so the text is held to the typed text's cap here."""
    check_text_size("Text", text_value if isinstance(text_value, str) else None, services.settings.text_cap_bytes)
    model = services.models.get(model_name)
    tokens = encode_walk(model, text_value)
    result = anatomy_of(model, tokens, layer_index, head_index, query_index, key_index, split, relative)
    found = {"tokens": token_texts(model, tokens.ids), "read": tokens.note or f"All {len(tokens.ids)} tokens read.",
             "layer": result.layer, "head": result.head,
             "query": result.query, "key": result.key, "split": split, "relative": bool(relative),
             "score": float(result.score), "query_labels": list(result.query_labels),
             "key_labels": list(result.key_labels), "matrix": result.matrix.tolist()}
    if relative:
        found["pair_score"] = float(result.pair_score)
    return found


def geometry_view(services: Services, model_name, text_value, layer_index, head_index, progress=None):
    """(note, scatter) of the head's queries and keys in one plane; the body of qk_geometry."""
    name = model_name
    model = services.models.get(name, progress)
    tokens_enc = encode_walk(model, text_value)
    result = geometry(model, tokens_enc, layer_index, head_index)
    tokens = token_texts(model, tokens_enc.ids)
    explained = result.explained.tolist()
    fig = geometry_figure(result.queries.numpy(), result.keys.numpy(), tokens,
                          f"Layer {result.layer}, head {result.head}: queries and keys in one plane", explained,
                          subtitle=PLANE_DEFINITION)
    note = (f"The head's {len(tokens)} queries and keys in one plane: {PLANE_DEFINITION}; its two axes hold "
            f"{100 * sum(explained):.0f} % of the variance. It is the plane the Across texts tab draws over a corpus. "
            "A score is q·k, a dot product, so a query near a key is a guide to a high score, not a measure of one. "
            "Colour is position.")
    return note, export.named(fig, export.filename(name, "qk-geometry", result.layer, result.head))
