"""The Inside tab's views: one real forward pass, stage by stage, for one head and its layer on a short text, each
stage with its equation, its shapes, a figure of the real numbers and what to notice (measured); then why the head
attends from one token to another. The bodies of the forward_walk, score_anatomy and qk_geometry endpoints."""

from __future__ import annotations

import io

import numpy as np

from ui.plots.attention import stages_figure
from ui.plots.base import empty_figure
from ui.plots.inside import (content_position_figure, decomposition_figure, geometry_figure, next_token_figure,
                             rotation_figure, stage_panels, token_bars)
from ui.plots.text import escaped
from ui.services import Services
from ui.services.checks import public_text
from ui.services.inside import (anatomy_of, check_token, content_and_position, encode_walk, geometry, measures,
                                next_token, stack_config, stage_arrays, walk)
from ui.services.text import token_pieces, token_texts
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
    where = ("added to each row, eq. 4.2: X = X_embed + PE" if stages.positions is not None
             else "none added here: RoPE rotates queries and keys inside each head instead (stage 4)")
    note = (f"**1 · Tokens → embeddings.** Each token id picks a row of the embedding table"
            f"{f', times {cfg.embed_scale:g}' if cfg.embed_scale != 1 else ''}; positions: {where}. "
            f"Shapes: {shapes(ids=[len(tokens)], X=list(stages.embeddings.shape))}. The followed token "
            f"{quoted(tokens[token])} has id {int(stages.tokens[token])}; its row's length is "
            f"{float(stages.embeddings[token].norm()):.2f}.")
    return note, fig


def norm_stage(stages, tokens, token, cfg, m) -> tuple[str, object]:
    kind = "RMSNorm x / rms(x) · γ" if cfg.norm == "rmsnorm" else "LayerNorm γ ⊙ (x − μ)/√(σ² + ε) + β (eq. 5.4)"
    placement = ("before attention (Pre-LN: x + f(norm(x)))" if cfg.norm_placement == "pre"
                 else "after attention and the residual (Post-LN: norm(x + f(x)), eq. 5.1); the bars are that norm's")
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
           f"{cfg.n_heads // cfg.n_kv_heads}× fewer keys and values."
           if len(stages.shared_heads) > 1 else "Every query head has its own keys and values.")
    note = (f"**3 · Q, K, V for head {stages.head}** (eq. 3.1: q = x·W_Q, k = x·W_K, v = x·W_V, per head). Shapes: "
            f"{shapes(x=list(stages.attn_in.shape), q=list(stages.q.shape), k=list(stages.k.shape))}. {gqa}")
    return note, fig


def rope_stage(stages, tokens, token) -> tuple[str, object]:
    if stages.rope_angles is None:
        text = "This model adds its positions to the embeddings (stage 1): no rotation here."
        return f"**4 · Positions in the head.** {text}", empty_figure(text, 160)
    angles = stages.rope_angles[token].numpy()
    before = stages.q_unrotated[token].numpy().reshape(2, -1).T      # pair i: dimensions i and i + d/2
    after = stages.q[token].numpy().reshape(2, -1).T
    fig = rotation_figure(angles, before, after, f"4 · RoPE on the query of {quoted(tokens[token])} (position {token})")
    kept = np.linalg.norm(before, axis=1) - np.linalg.norm(after, axis=1)
    note = (f"**4 · RoPE.** Each of the {len(angles)} frequency pairs of q and k turns by the angle m·θ_i, "
            f"θ_i = base^(−2i/d_head): at position {token} the fastest pair has turned {angles[0]:.2f} rad, the "
            f"slowest {angles[-1]:.4f}. A rotation keeps each pair's length (largest change here "
            f"{np.abs(kept).max():.1e}), and q_m·k_n then depends on m − n only.")
    return note, fig


def score_stage(stages, tokens, token, m) -> tuple[str, object]:
    scaled = (stages.scores * stages.scale).numpy()
    masked = np.where(stages.mask.numpy(), scaled, -np.inf)
    labels = [f"{i} {t}" for i, t in enumerate(tokens)]
    fig = stages_figure({f"head {stages.head}": (scaled, masked, stages.probs.numpy())}, labels, labels,
                        "5 · QKᵀ/√d_k, the mask, the softmax (click a cell: why this weight?)")
    row = stages.probs[token].numpy()
    top = int(row.argmax())
    note = (f"**5 · Scores → weights** (eq. 2.1: softmax(QKᵀ/√d_k + M)). Shapes: "
            f"{shapes(S=list(stages.scores.shape))}. The variance of q·k over this head's cells is "
            f"**{m.qk_variance:.1f}** with d_k = {m.d_head}; scaled by 1/√d_k it is **{m.scaled_variance:.2f}**. "
            f"Without the scale the rows' mean entropy would fall from {m.entropy:.2f} to {m.entropy_unscaled:.2f} nats "
            f"(sharper, closer to one-hot). {quoted(tokens[token])} puts {row[top]:.2f} of its weight on "
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


def walk_view(services: Services, model_name, text_value, layer_index, head_index, token_index, temperature_value,
              top_k_value, top_p_value, progress=None):
    """(note, then a note and a figure per stage, then the .npz of every stage); the body of forward_walk."""
    name = model_name
    model = services.models.get(name, progress)
    tokens_enc = encode_walk(model, text_value)
    stages = walk(model, tokens_enc, layer_index, head_index)
    token = check_token(tokens_enc, token_index)
    tokens = token_texts(model, tokens_enc.ids)
    cfg = stack_config(model)
    m = measures(stages, token)
    parts = [embedding_stage(stages, tokens, token, cfg), norm_stage(stages, tokens, token, cfg, m),
             qkv_stage(stages, tokens, token, model.config), rope_stage(stages, tokens, token),
             score_stage(stages, tokens, token, m), output_stage(stages, tokens, token, m),
             mlp_stage(stages, tokens, token, cfg, m),
             logits_stage(model, stages, tokens, token, temperature_value, top_k_value, top_p_value)]
    base = export.filename(name, "inside", stages.layer, stages.head)
    outputs = []
    for i, (note, fig) in enumerate(parts, start=1):
        outputs += [note, export.named(fig, f"{base}_stage{i}")]
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **stage_arrays(stages), token_pieces=np.array(token_pieces(model, tokens_enc.ids)))
    file = export.write(buffer.getvalue(), base + ".npz")
    head = (f"{len(tokens)} tokens through layer {stages.layer}, head {stages.head} of {escaped(public_text(name))}, following "
            f"{quoted(tokens[token])} (position {token}). Every number below is this pass's own.")
    if tokens_enc.note:
        head += f"  \n{escaped(tokens_enc.note)}"
    return (head, *outputs, str(file))


def anatomy_view(services: Services, model_name, text_value, layer_index, head_index, query_index, key_index,
                 progress=None):
    """(note, decomposition heatmap, content against position): why the head weighs `key` from `query`; the
    body of score_anatomy."""
    name = model_name
    model = services.models.get(name, progress)
    tokens_enc = encode_walk(model, text_value)
    result = anatomy_of(model, tokens_enc, layer_index, head_index, query_index, key_index)
    stages = walk(model, tokens_enc, result.layer, result.head)
    tokens = token_texts(model, tokens_enc.ids)
    q, k = result.query, result.key
    matrix = result.matrix.numpy()
    order = np.argsort(-np.abs(matrix), axis=None)[:3]
    largest = "; ".join(f"query side: {escaped(result.query_labels[i // matrix.shape[1]])}, key side: "
                        f"{escaped(result.key_labels[i % matrix.shape[1]])} ({matrix.flat[i]:+.2f})" for i in order)
    fig = decomposition_figure(matrix, result.query_labels, result.key_labels,
                               f"Why {quoted(tokens[q])} → {quoted(tokens[k])}: the score {result.score:+.3f} "
                               f"as a sum of {matrix.size} parts")
    series = content_and_position(model, tokens_enc, stages, q)
    line = content_position_figure(tokens, series, q, f"Every key of {quoted(tokens[q])}, layer {result.layer}, "
                                                      f"head {result.head}")
    masked = "" if result.allowed else " The mask hides this key from this query, so its weight is 0 whatever the score."
    extra = ""
    if result.unrotated_score is not None:
        extra = (f" Without the rotation the same q and k give {result.unrotated_score:+.3f}: RoPE (position) adds "
                 f"{result.score - result.unrotated_score:+.3f}.")
    elif result.terms:
        extra = " " + ", ".join(f"{escaped(t)} {v:+.3f}" for t, v in result.terms.items()) + "."
    note = (f"The scaled score q·k/√d_k from {quoted(tokens[q])} (query {q}) to {quoted(tokens[k])} (key {k}) is "
            f"**{result.score:+.3f}**. Written as a sum over what each side's residual stream is made of (every norm "
            f"frozen at its value on this text), the {matrix.size} parts add up to **{matrix.sum():+.3f}**. "
            f"Largest: {largest}.{extra}{masked}")
    return note, export.named(fig, export.filename(name, "score-anatomy", result.layer, result.head)), \
        export.named(line, export.filename(name, "content-position", result.layer, result.head))


def geometry_view(services: Services, model_name, text_value, layer_index, head_index, progress=None):
    """(note, scatter) of the head's queries and keys in one plane; the body of qk_geometry."""
    name = model_name
    model = services.models.get(name, progress)
    tokens_enc = encode_walk(model, text_value)
    result = geometry(model, tokens_enc, layer_index, head_index)
    tokens = token_texts(model, tokens_enc.ids)
    explained = result.explained.tolist()
    fig = geometry_figure(result.queries.numpy(), result.keys.numpy(), tokens,
                          f"Layer {result.layer}, head {result.head}: queries and keys in one plane", explained)
    note = (f"The head's {len(tokens)} queries and keys, centred together and projected on the same two axes (their "
            f"top principal components: {100 * sum(explained):.0f} % of the variance), so a query near a key "
            "scores it high. Colour is position.")
    return note, export.named(fig, export.filename(name, "qk-geometry", result.layer, result.head))
