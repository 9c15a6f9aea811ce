"""Inside one forward pass: every stage one text goes through in one attention head and its layer, read from the
pass's own records (core/probe.py), never from a second implementation of the model.

- forward_stages: the arrays of every stage, from the token ids to the logits, for one layer and head.
- the parts one attention score splits into (ScoreDecomposition, residual_parts, projected_parts, add_stages): the
  residual stream's parts (the embeddings, the positions, each earlier layer's attention and MLP output, the
  biases), with every norm on the way frozen at its value on this input (Norm.frozen). The split itself is
  qk.qk_attribution, whose by="layer" form is qk.score_decomposition.
- qk_geometry: the head's queries and keys over the text in the one query/key plane (plane.py: keys shifted by
  mean(q) − mean(k), then PCA of both, AttentionViz's translation), the plane the corpus view draws too.

Both read the stack that reads the text (Transformer.attention_stack): the main stack of a decoder (GPT-2,
Llama) or of an encoder (BERT, no causal mask; MiniLM has no LM head, so no logits), and a seq2seq model's encoder
(Marian, T5: its self-attention; the decoder is not run, so no logits either).

Each layer's attention terms are the model's own (core/attention.py, in this order): S = q·kᵀ·scale with the
family's scale (stack.cfg.score_scale), the soft-cap c·tanh(S/c) (Gemma 2), the score bias (ALiBi's −m_h·(i − j),
T5's relative buckets), then the mask, causal and on "sliding" layers a window i − j < w. The stages keep each
apart, and the decomposition splits the value before the cap, the only place where a score is a sum.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention import layer_mask, soft_cap
from ..config import check_index
from ..corpus.jobs import one_text
from ..layers import rope_angles
from ..probe import Probe
from ..plane import joint_plane

# forward_stages' arrays in the order the pass computes them
STAGES = ("tokens", "embeddings", "positions", "token_types", "resid_pre", "norm_scale", "attn_in", "q_unrotated",
          "k_unrotated", "rope_angles", "q", "k", "v", "scores", "capped", "bias", "scored", "mask", "probs", "z",
          "attn_out", "mlp_in",
          "mlp_up", "mlp_gate", "mlp_hidden", "mlp_out", "resid_post", "final", "logits")
STAGE_RECORDS = ("embed", "pos_embed", "type_embed", "resid_pre", "attn_in", "q_unrotated", "k_unrotated", "q", "k",
                 "v", "pattern", "z", "attn_out", "mlp_in", "mlp_up", "mlp_gate", "mlp_hidden", "mlp_out",
                 "resid_post")
DECOMPOSITION_RECORDS = ("embed", "pos_embed", "type_embed", "resid_pre", "attn_out", "mlp_in", "mlp_out",
                         "q", "k", "q_unrotated", "k_unrotated")


# ---- checks and the recorded pass ----

def check_text(model, ids: Tensor) -> Tensor:
    """One text [T] or [1, T] (corpus.jobs.one_text) of at least one token the model knows, as [1, T]."""
    ids = one_text(ids)
    if ids.shape[1] == 0:
        raise ValueError("ids is empty: one text needs at least one token")
    vocab = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"token ids must lie in 0..{vocab - 1}; got {int(ids.min())}..{int(ids.max())}")
    return ids


def recorded(model, ids: Tensor, names: tuple[str, ...], layers) -> tuple[dict[str, dict[int, Tensor]], Tensor]:
    """One pass of the stack that reads ids [1, T], keeping `names` (probe.RECORDABLE) at `layers`: records
    name → layer → value without the batch axis (the embeddings' parts at layer 0; a name the model does not
    compute maps to {}), and the stack's output [1, T, d] (after its final norm)."""
    stack, kind = model.attention_stack()
    probe = Probe(model.config, {Probe.full_name(kind, name) for name in names}, layers=layers)
    with torch.inference_mode():
        hidden = model.run_stack(stack, ids.to(model.device), None, kind=kind, causal=stack.cfg.causal, probe=probe)
    found = {name: probe.records.get(Probe.full_name(kind, name), {}) for name in names}
    return {name: {l: t[0] for l, t in by_layer.items()} for name, by_layer in found.items()}, hidden


def head_scale(stack) -> float:
    """The factor on q·k (eq. 2.1), the one the stack's attention uses: 1/√d_k, query_pre_attn_scalar^-½ (Gemma),
    1 (T5, or a model trained without it)."""
    return stack.cfg.score_scale


# what each kind of score bias is called in words (ScoreBias.kind → label)
BIAS_LABELS = {"alibi": "position bias (ALiBi)", "relative": "relative-position bias (T5)"}


def head_bias(stack, head: int, n: int, device) -> Tensor | None:
    """[T, T] float32 the score bias of `head` on one unpadded text (ALiBi: −m_h·(i − j); T5: its bucket of
    j − i), or None where the stack has none. Positions 0..T-1 are what the pass uses with no padding."""
    if stack.score_bias is None:
        return None
    positions = torch.arange(n, device=device)[None]
    with torch.inference_mode():
        return cpu(stack.score_bias(positions, positions)[0, head])


def cpu(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().float().cpu()


# ---- every stage ----

@dataclass
class ForwardStages:
    """One text's trip through one head and its layer (names: STAGES). Arrays are on the CPU, float32 (tokens long,
    mask bool), T is the text's length, and a stage the model does not have is None. In Post-LN blocks (BERT,
    Marian, OPT's Post-LN) the norm comes after each sublayer: attn_in is resid_pre, mlp_in is
    norm(resid_pre + attn_out), and norm_scale is that norm's, the one after attention. In parallel blocks
    (GPT-NeoX) mlp_in is norm₂(resid_pre), read beside attention; with sandwich norms (Gemma 2/3) attn_out and
    mlp_out are after their post norms, what joins the residual stream.

    The scores in eq. 2.1's order, as the layer computes them: scores·scale, capped = c·tanh(scores·scale / c)
    where the family soft-caps (else None), scored = (capped or scores·scale) + bias, then softmax(scored + M)
    with M from mask, which is probs."""
    kind: str                       # the stack: "self" (a decoder's or an encoder's main stack), "encoder" (seq2seq)
    layer: int
    head: int
    kv_head: int                    # the key/value head this query head reads
    shared_heads: tuple[int, ...]   # every query head that reads kv_head (more than one under GQA)
    scale: float                    # the factor on q·k: stack.cfg.score_scale (1/√d_k; Gemma's
                                    # query_pre_attn_scalar^-½; 1 for T5 or a model trained without it)
    layer_type: str                 # "full" or "sliding" (config.layer_type)
    window: int | None              # the sliding window w of this layer: keys i − j ≥ w back are masked
    softcap: float | None           # the soft-cap c on this layer's scaled scores (Gemma 2)
    bias_kind: str | None           # the score bias: "alibi" (BLOOM), "relative" (T5), or None
    tokens: Tensor                  # [T] long, the ids
    embeddings: Tensor              # [T, d] the token rows × embed_scale
    positions: Tensor | None        # [T, d] added to them: learned (GPT-2, BERT) or sinusoidal (eq. 4.1, Marian)
    token_types: Tensor | None      # [T, d] (BERT)
    resid_pre: Tensor               # [T, d] the block's input (layer 0: the sum of the parts above, eq. 4.2; BERT
                                    # normalises it)
    norm_scale: Tensor              # [T] 1/s of the attention norm: 1/rms(x) (RMSNorm), 1/√(σ² + ε) (LayerNorm);
                                    # its gain (γ, or Gemma's 1 + γ) multiplies after
    attn_in: Tensor                 # [T, d] what the head's projections read: norm(resid_pre) in Pre-LN
    q_unrotated: Tensor             # [T, d_head] attn_in·W_Q + b_Q, before RoPE (equal to q without RoPE); with
                                    # QK-norm (Qwen3, Gemma 3) after that norm, as the model records it
    k_unrotated: Tensor             # [T, d_head] of kv_head
    rope_angles: Tensor | None      # [T, rotary_dim/2] m·θ_i, the angle of frequency pair i at position m (RoPE
                                    # only; the rotated dims only under partial rotary; a "sliding" layer's base)
    q: Tensor                       # [T, d_head] the queries as attention uses them (after RoPE)
    k: Tensor                       # [T, d_head]
    v: Tensor                       # [T, d_head]
    scores: Tensor                  # [T, T] S = q·kᵀ, before the scale and the mask
    capped: Tensor | None           # [T, T] c·tanh(S·scale / c), soft-capped models only
    bias: Tensor | None             # [T, T] this head's score bias: ALiBi −m_h·(i − j), or T5's bucket bias
    scored: Tensor                  # [T, T] what the mask and softmax read: (capped or S·scale) + bias
    mask: Tensor                    # [T, T] bool, True where the query may read the key (causal, window)
    probs: Tensor                   # [T, T] softmax(scored + M), eq. 2.1
    z: Tensor                       # [T, d_head] probs·v, the head's output before W^O
    attn_out: Tensor                # [T, d] the whole layer's attention output Σ_h z_h·W_O[h] + b_O (eq. 3.1)
    mlp_in: Tensor                  # [T, d]
    mlp_up: Tensor                  # [T, d_ff] the up projection (before the activation where not gated)
    mlp_gate: Tensor | None         # [T, d_ff] act(gate projection), gated FFNs (SwiGLU) only
    mlp_hidden: Tensor              # [T, d_ff] what enters the down projection: act(up), or act(gate) ⊙ up
    mlp_out: Tensor                 # [T, d]
    resid_post: Tensor              # [T, d] the block's output
    final: Tensor                   # [T, d] the stack's output, after its final norm where it has one
    logits: Tensor | None           # [T, vocab] a decoder's or an MLM's; None without an LM head or for an encoder


def forward_stages(model, ids: Tensor, layer: int, head: int) -> ForwardStages:
    """Every stage of ids [1, T] through `head` of `layer` and the rest of its layer, from one recorded pass.
    Decoders (GPT-2, Llama) have every stage (positions only where learned, rope_angles only with RoPE,
    mlp_gate only when gated); BERT has no causal mask and adds token types; MiniLM has no logits; for Marian
    and T5 these are the stages of the encoder's self-attention, with no logits. The mask, the window, the
    scale, the cap and the bias are the layer's own (see ForwardStages); softmax(scored + M) is probs."""
    ids = check_text(model, ids)
    layer, head = model.check_head(layer, head)
    stack, kind = model.attention_stack()
    kv, group = stack.cfg.kv_head(head), stack.cfg.kv_group
    shared = tuple(range(kv * group, (kv + 1) * group))
    n = ids.shape[1]
    rec, hidden = recorded(model, ids, STAGE_RECORDS, {layer})
    at = lambda name: cpu(rec[name].get(layer))                                         # noqa: E731
    embedded = lambda name: cpu(rec[name].get(0))                                       # noqa: E731
    q, k = at("q")[:, head], at("k")[:, kv]                                             # [T, d_head]
    block = stack.blocks[layer]
    norm_input = rec["resid_pre"][layer] if block.pre_norm else rec["resid_pre"][layer] + rec["attn_out"][layer]
    with torch.inference_mode():
        norm_scale = 1 / block.attn_norm.divisor(norm_input)[:, 0]                      # [T]
        # every position's whole row, [T, vocab], is the result: the Inside view follows any token and draws its
        # full next-token distribution under temperature, top-k and top-p, on a text of a few dozen tokens
        logits = model.logits(hidden) if kind == "self" and model.lm_head is not None else None
    inv_freq = model.layer_inv_freq(stack, layer)
    angles = None if inv_freq is None else rope_angles(torch.arange(n), inv_freq.cpu())               # [T, r/2]
    scale, cap, bias = head_scale(stack), stack.cfg.attn_softcap, head_bias(stack, head, n, model.device)
    scaled = (q @ k.T) * scale                                                          # eq. 2.1: QKᵀ·scale
    capped = None if cap is None else soft_cap(scaled, cap)
    scored = (scaled if capped is None else capped) + (0 if bias is None else bias)
    return ForwardStages(
        kind=kind, layer=layer, head=head, kv_head=kv, shared_heads=shared, scale=scale,
        layer_type=stack.cfg.layer_type(layer), window=stack.cfg.layer_window(layer), softcap=cap,
        bias_kind=None if stack.score_bias is None else stack.score_bias.kind,
        tokens=ids[0].cpu(), embeddings=embedded("embed"), positions=embedded("pos_embed"),
        token_types=embedded("type_embed"), resid_pre=at("resid_pre"),
        norm_scale=cpu(norm_scale), attn_in=at("attn_in"),
        q_unrotated=at("q_unrotated")[:, head], k_unrotated=at("k_unrotated")[:, kv], rope_angles=angles,
        q=q, k=k, v=at("v")[:, kv],
        scores=q @ k.T, capped=capped, bias=bias, scored=scored, mask=layer_mask(stack.cfg, layer, n),
        probs=at("pattern")[head], z=at("z")[:, head], attn_out=at("attn_out"),
        mlp_in=at("mlp_in"), mlp_up=at("mlp_up"), mlp_gate=at("mlp_gate"), mlp_hidden=at("mlp_hidden"),
        mlp_out=at("mlp_out"), resid_post=at("resid_post"), final=cpu(hidden[0]),
        logits=None if logits is None else cpu(logits[0]))


# ---- one score as a sum of parts ----

@dataclass
class ScoreDecomposition:
    """score = q_query·k_key·scale, before the cap, the bias and the mask, as a sum over pairs of parts: matrix[a, b]
    is what query part a and key part b give, and matrix.sum() is the score. The parts are the residual stream's:
    "embeddings", "positions" (learned or sinusoidal), "token types" (BERT), "L3 attn" and "L3 MLP" for every
    layer before this one, and "bias" (the q/k biases and every norm's β on the way). See qk.score_decomposition.

    After the sum come the layer's other terms, each its own stage: capped = c·tanh(score / c) where the family
    soft-caps (a tanh: no part maps through it linearly, so the parts add up to the value before the cap), then
    bias_term, the score bias at this (query, key), which carries the positions in ALiBi and T5. scored is what
    the mask and softmax read: (capped or score) + bias_term."""
    layer: int
    head: int
    kv_head: int
    query: int                      # positions in the text
    key: int
    score: float                    # q·k·scale from the pass's own queries and keys, before any cap
    allowed: bool                   # the mask lets this query read this key (False: the score is masked out)
    matrix: Tensor                  # [n_parts, n_parts] float32, query parts × key parts
    query_labels: list[str]
    key_labels: list[str]
    scored: float = 0.0                         # what the mask and softmax read: (capped or score) + bias_term
    softcap: float | None = None                # c, where the layer soft-caps its scores (Gemma 2)
    capped: float | None = None                 # c·tanh(score / c): its own stage, not a sum of the parts
    bias_term: float | None = None              # the score bias at (query, key): ALiBi −m_h·(i − j), T5's bucket
    bias_label: str | None = None               # its name in words (BIAS_LABELS)
    unrotated_score: float | None = None        # RoPE: q_unrotated·k_unrotated·scale, the score without rotation
    pair_scores: Tensor | None = None           # RoPE: [r/2] each rotated frequency pair's part of the score, and
                                                # under partial rotary (r < d_head) one last entry: the unrotated
                                                # dims' part, [r/2 + 1] in all
    unrotated_pair_scores: Tensor | None = None  # RoPE: the same without rotation
    terms: dict[str, float] | None = None       # learned or sinusoidal positions: "token·token", "token·position",
                                                # "position·token", "position·position" (query·key), summing to score


def through_norm(norm, x: Tensor, parts: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """parts [n, P, d] and bias [P, d] after a norm at its input x [P, d], with the scale frozen (Norm.frozen): the
    scale acts on every part, and β joins the bias."""
    frozen = norm.frozen(x)
    beta = 0.0 if norm.bias is None else norm.bias.float()
    return frozen(parts), frozen(bias) + beta


def residual_parts(stack, rec: dict, layer: int, at: Tensor, attn_parts=None) -> tuple[list[str], Tensor, Tensor]:
    """What layer `layer`'s attention reads at positions `at` [P], as labels, parts [n, P, d] and a bias [P, d]
    (float32) with attn_in[at] = parts.sum(0) + bias. Pre-LN: resid_pre = embeddings + Σ_{l<layer} (attn_out_l +
    mlp_out_l) and the attention norm frozen on top. Post-LN (eqs. 5.1, 5.2): each part passes every later norm,
    each frozen at its own input on this text. attn_parts(l, at) → (labels, parts [k, P, d]) splits layer l's
    attn_out[at] into parts that add up to it (one per head, say); by default it is one part, "L3 attn"."""
    labels, parts = [], []
    for name, label in (("embed", "embeddings"), ("pos_embed", "positions"), ("type_embed", "token types")):
        if 0 in rec[name]:
            labels.append(label)
            parts.append(rec[name][0][at].float())                                      # [P, d]
    parts = torch.stack(parts)                                                          # [n, P, d]
    bias = torch.zeros_like(parts[0])
    if stack.embed.norm is not None:  # BERT: LayerNorm of the embeddings' sum
        parts, bias = through_norm(stack.embed.norm, parts.sum(0), parts, bias)
    pick = lambda name, l: rec[name][l][at].float()                                    # noqa: E731  [P, d]
    chunks = [parts]                # joined once at the end (Post-LN: before each norm), not once per part
    for l in range(layer):
        block = stack.blocks[l]
        for sublayer, label, norm, before in (("attn_out", "attn", block.attn_norm, "resid_pre"),
                                              ("mlp_out", "MLP", block.ffn_norm, "mlp_in")):
            if sublayer == "attn_out" and attn_parts is not None:
                names, split = attn_parts(l, at)                                        # [k, P, d]
                labels += names
                chunks.append(split.float())
            else:
                labels.append(f"L{l} {label}")
                chunks.append(pick(sublayer, l)[None])                                  # [1, P, d]
            if not block.pre_norm:   # norm(x + f(x)): x is resid_pre for attention, mlp_in for the MLP
                parts, bias = through_norm(norm, pick(before, l) + pick(sublayer, l), torch.cat(chunks), bias)
                chunks = [parts]
    parts = torch.cat(chunks)                                                           # [n, P, d]
    block = stack.blocks[layer]
    if block.pre_norm:
        parts, bias = through_norm(block.attn_norm, rec["resid_pre"][layer][at].float(), parts, bias)
    return labels, parts, bias


def pair_sum(v: Tensor, rotary_dim: int | None = None) -> Tensor:
    """[..., d_head] → [..., r/2]: RoPE rotates dimensions i and i + r/2 together (rotate-half), r = rotary_dim
    (all of d_head by default). Under partial rotary (r < d_head) one more entry, the sum of the unrotated dims:
    [..., r/2 + 1]. The entries add up to v.sum(-1)."""
    r = v.shape[-1] if rotary_dim is None else rotary_dim
    first, second = v[..., :r].chunk(2, dim=-1)
    if r == v.shape[-1]:
        return first + second
    return torch.cat([first + second, v[..., r:].sum(-1, keepdim=True)], dim=-1)


def projected_parts(stack, w, layer: int, index: int, rows: Tensor, side: str) -> Tensor:
    """rows [n + 1, ..., d] (the residual parts and the bias row last, at any positions) → [n + 1, ..., d_head]
    on one side of the score: side "query" through W_Q[index] and b_Q (into the last row), "key" through W_K[index]
    and b_K, then with QK-norm the q or k norm frozen at what the parts add up to (Norm.frozen over d_head),
    before RoPE."""
    attn = stack.blocks[layer].attn
    weight, bias, norm = (w.W_Q, w.b_Q, attn.q_norm) if side == "query" else (w.W_K, w.b_K, attn.k_norm)
    parts = rows @ weight[index].float()
    if bias is not None:
        parts[-1] += bias[index].float()
    if norm is not None:  # the parts sum to the head's q (k) before the norm: freeze the norm there
        parts = torch.cat(through_norm(norm, parts.sum(0), parts[:-1], parts[-1:]))
    return parts


def add_stages(result: ScoreDecomposition, model, stack, rec: dict, score: float) -> None:
    """The terms after the sum at result's (layer, head, query, key), set on result from the pass's records rec:
    scored, and where the layer has them the soft-cap, the score bias and RoPE's rotated and unrotated scores.
    score: q·k·scale at the pair, before the cap."""
    layer, head, kv, query, key = result.layer, result.head, result.kv_head, result.query, result.key
    cap, scale = stack.cfg.attn_softcap, head_scale(stack)
    result.softcap, result.scored = cap, score
    if cap is not None:  # a tanh: its own stage after the sum
        result.capped = result.scored = soft_cap(torch.tensor(score, dtype=torch.float64), cap).item()
    at = torch.tensor([query, key], device=model.device)
    if stack.score_bias is not None:  # positions [1, 1] of the query and of the key: bias [1, H, 1, 1]
        result.bias_term = stack.score_bias(at[None, :1], at[None, 1:])[0, head, 0, 0].item()
        result.bias_label = BIAS_LABELS[stack.score_bias.kind]
        result.scored += result.bias_term
    rope = model.layer_rope(stack, layer, at[None])
    if rope is not None:
        r = rope[0].shape[-1]
        q, k = rec["q"][layer][query, head].float(), rec["k"][layer][key, kv].float()   # [d_head]
        q_u = rec["q_unrotated"][layer][query, head].float()
        k_u = rec["k_unrotated"][layer][key, kv].float()
        result.unrotated_score = (q_u @ k_u).item() * scale
        result.pair_scores = cpu(pair_sum(q * k, r) * scale)                            # [r/2] (+1 if r < d_head)
        result.unrotated_pair_scores = cpu(pair_sum(q_u * k_u, r) * scale)


def position_terms(matrix: Tensor, position: int) -> dict[str, float]:
    """The score split by whether each side's part is the positions part (index `position`) or not."""
    is_position = torch.zeros(matrix.shape[0], dtype=torch.bool)
    is_position[position] = True
    token = ~is_position
    block = lambda rows, cols: matrix[rows][:, cols].sum().item()                       # noqa: E731
    return {"token·token": block(token, token), "token·position": block(token, is_position),
            "position·token": block(is_position, token), "position·position": block(is_position, is_position)}


# ---- where the queries and keys lie ----

@dataclass
class QKGeometry:
    """The head's queries and keys over the text in the one query/key plane (plane.joint_plane: keys shifted by
    mean(q) − mean(k), then PCA of both, AttentionViz's translation), the plane the corpus view draws too. Scores
    are dot products, not distances: the plane shows their relative placement."""
    layer: int
    head: int
    kv_head: int
    rotated: bool                   # after RoPE (what attention dots), or before it
    queries: Tensor                 # [T, 2]
    keys: Tensor                    # [T, 2]
    explained: Tensor               # [2] the share of the union's variance along each axis
    components: Tensor              # [2, d_head] the axes (each with its largest loading positive)
    mean: Tensor                    # [d_head] the union's mean (= mean(q)) taken off before projecting
    shift: Tensor                   # [d_head] mean(q) − mean(k), added to every key


def qk_geometry(model, ids: Tensor, layer: int, head: int, rotated: bool = True) -> QKGeometry:
    """`head`'s queries and its key/value head's keys over ids [1, T] in `layer`, [T, d_head] each, in
    plane.joint_plane (AttentionViz's translation, then a joint PCA)."""
    ids = check_text(model, ids)
    layer, head = model.check_head(layer, head)
    stack, _ = model.attention_stack()
    kv = stack.cfg.kv_head(head)
    names = ("q", "k") if rotated else ("q_unrotated", "k_unrotated")
    rec, _ = recorded(model, ids, names, {layer})
    q, k = cpu(rec[names[0]][layer][:, head]), cpu(rec[names[1]][layer][:, kv])        # [T, d_head]
    plane = joint_plane(q, k)
    t = q.shape[0]
    return QKGeometry(layer, head, kv, rotated, plane.points[:t], plane.points[t:], plane.explained,
                      plane.components, plane.mean, plane.shift)
