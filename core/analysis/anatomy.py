"""Inside one forward pass: every stage one text goes through in one attention head and its layer, read from the
pass's own records (core/probe.py), never from a second implementation of the model.

- forward_stages: the arrays of every stage, from the token ids to the logits, for one layer and head.
- score_decomposition: one attention score q·k·scale written as a sum over pairs of residual-stream parts (the
  embeddings, the positions, each earlier layer's attention and MLP output, the biases), query side × key side,
  with every norm on the way frozen at its value on this input (Norm.frozen), so the parts add up to the score.
- qk_geometry: the head's queries and keys over the text in one shared 2-D projection (PCA).

All three read the stack that reads the text (Transformer.attention_stack): the main stack of a decoder (GPT-2,
Llama) or of an encoder (BERT, no causal mask; MiniLM has no LM head, so no logits), and a seq2seq model's encoder
(Marian: its self-attention; the decoder is not run, so no logits either).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention import causal_mask
from ..layers import rope_angles, rotate
from ..probe import Probe

# forward_stages' arrays in the order the pass computes them
STAGES = ("tokens", "embeddings", "positions", "token_types", "resid_pre", "norm_scale", "attn_in", "q_unrotated",
          "k_unrotated", "rope_angles", "q", "k", "v", "scores", "mask", "probs", "z", "attn_out", "mlp_in",
          "mlp_up", "mlp_gate", "mlp_hidden", "mlp_out", "resid_post", "final", "logits")
STAGE_RECORDS = ("embed", "pos_embed", "type_embed", "resid_pre", "attn_in", "q_unrotated", "k_unrotated", "q", "k",
                 "v", "pattern", "z", "attn_out", "mlp_in", "mlp_up", "mlp_gate", "mlp_hidden", "mlp_out",
                 "resid_post")
DECOMPOSITION_RECORDS = ("embed", "pos_embed", "type_embed", "resid_pre", "attn_out", "mlp_in", "mlp_out",
                         "q", "k", "q_unrotated", "k_unrotated")


# ---- checks and the recorded pass ----

def check_index(value, n: int, what: str, where: str) -> int:
    """value in 0..n-1 (or -n..-1, counted from the end) → 0..n-1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if not -n <= value < n:
        raise IndexError(f"{what} {value} is out of range: {where} 0..{n - 1}")
    return value % n


def check_text(model, ids: Tensor) -> Tensor:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ValueError(f"ids must be one text of token ids, [1, T] with T ≥ 1; got "
                         f"{list(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be integer token ids, got {ids.dtype}")
    vocab = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"token ids must lie in 0..{vocab - 1}; got {int(ids.min())}..{int(ids.max())}")
    return ids


def check_head(model, layer: int, head: int) -> tuple[int, int]:
    """(layer, head) of the stack that reads the text, checked."""
    stack, kind = model.attention_stack()
    name = "the encoder" if kind == "encoder" else "the model"
    layer = check_index(layer, len(stack.blocks), "layer", f"{name} has layers")
    head = check_index(head, stack.cfg.n_heads, "head", f"layer {layer} has heads")
    return layer, head


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
    """The factor on q·k (eq. 2.1): 1/√d_k, or 1 for a model trained without it."""
    return stack.cfg.head_dim ** -0.5 if stack.cfg.scale_attention else 1.0


def kv_head_of(stack, head: int) -> tuple[int, tuple[int, ...]]:
    """The key/value head query head `head` reads, and every query head that reads it (grouped-query attention)."""
    group = stack.cfg.n_heads // stack.cfg.n_kv_heads
    kv = head // group
    return kv, tuple(range(kv * group, (kv + 1) * group))


def cpu(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().float().cpu()


# ---- every stage ----

@dataclass
class ForwardStages:
    """One text's trip through one head and its layer (names: STAGES). Arrays are on the CPU, float32 (tokens long,
    mask bool), T is the text's length, and a stage the model does not have is None. In Post-LN blocks (BERT,
    Marian) the norm comes after each sublayer: attn_in is resid_pre, mlp_in is norm(resid_pre + attn_out), and
    norm_scale is that norm's, the one after attention."""
    kind: str                       # the stack: "self" (a decoder's or an encoder's main stack), "encoder" (seq2seq)
    layer: int
    head: int
    kv_head: int                    # the key/value head this query head reads
    shared_heads: tuple[int, ...]   # every query head that reads kv_head (more than one under GQA)
    scale: float                    # the factor on q·k: 1/√d_k, or 1 for a model trained without it
    tokens: Tensor                  # [T] long, the ids
    embeddings: Tensor              # [T, d] the token rows × embed_scale
    positions: Tensor | None        # [T, d] added to them: learned (GPT-2, BERT) or sinusoidal (eq. 4.1, Marian)
    token_types: Tensor | None      # [T, d] (BERT)
    resid_pre: Tensor               # [T, d] the block's input (layer 0: the sum of the parts above, eq. 4.2; BERT
                                    # normalises it)
    norm_scale: Tensor              # [T] 1/s of the attention norm: 1/rms(x) (RMSNorm), 1/√(σ² + ε) (LayerNorm)
    attn_in: Tensor                 # [T, d] what the head's projections read: norm(resid_pre) in Pre-LN
    q_unrotated: Tensor             # [T, d_head] attn_in·W_Q + b_Q, before RoPE (equal to q without RoPE)
    k_unrotated: Tensor             # [T, d_head] of kv_head
    rope_angles: Tensor | None      # [T, d_head/2] m·θ_i, the angle of frequency pair i at position m (RoPE only)
    q: Tensor                       # [T, d_head] the queries as attention uses them (after RoPE)
    k: Tensor                       # [T, d_head]
    v: Tensor                       # [T, d_head]
    scores: Tensor                  # [T, T] S = q·kᵀ, before the scale and the mask
    mask: Tensor                    # [T, T] bool, True where the query may read the key
    probs: Tensor                   # [T, T] softmax(S·scale + M), eq. 2.1
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
    these are the stages of its encoder's self-attention, with sinusoidal positions and no logits."""
    ids = check_text(model, ids)
    layer, head = check_head(model, layer, head)
    stack, kind = model.attention_stack()
    kv, shared = kv_head_of(stack, head)
    n = ids.shape[1]
    rec, hidden = recorded(model, ids, STAGE_RECORDS, {layer})
    at = lambda name: cpu(rec[name].get(layer))                                         # noqa: E731
    embedded = lambda name: cpu(rec[name].get(0))                                       # noqa: E731
    q, k = at("q")[:, head], at("k")[:, kv]                                             # [T, d_head]
    block = stack.blocks[layer]
    norm_input = rec["resid_pre"][layer] if block.pre_norm else rec["resid_pre"][layer] + rec["attn_out"][layer]
    with torch.inference_mode():
        norm_scale = 1 / block.attn_norm.divisor(norm_input)[:, 0]                      # [T]
        logits = model.logits(hidden) if kind == "self" and model.lm_head is not None else None
    angles = None
    if stack.cfg.positional == "rope":
        angles = rope_angles(torch.arange(n), model.inv_freq.cpu())                     # [T, d_head/2]
    return ForwardStages(
        kind=kind, layer=layer, head=head, kv_head=kv, shared_heads=shared, scale=head_scale(stack),
        tokens=ids[0].cpu(), embeddings=embedded("embed"), positions=embedded("pos_embed"),
        token_types=embedded("type_embed"), resid_pre=at("resid_pre"),
        norm_scale=cpu(norm_scale), attn_in=at("attn_in"),
        q_unrotated=at("q_unrotated")[:, head], k_unrotated=at("k_unrotated")[:, kv], rope_angles=angles,
        q=q, k=k, v=at("v")[:, kv],
        scores=q @ k.T,                                                                 # eq. 2.1: S = QKᵀ [T, T]
        mask=causal_mask(n, n) if stack.cfg.causal else torch.ones(n, n, dtype=torch.bool),
        probs=at("pattern")[head], z=at("z")[:, head], attn_out=at("attn_out"),
        mlp_in=at("mlp_in"), mlp_up=at("mlp_up"), mlp_gate=at("mlp_gate"), mlp_hidden=at("mlp_hidden"),
        mlp_out=at("mlp_out"), resid_post=at("resid_post"), final=cpu(hidden[0]),
        logits=None if logits is None else cpu(logits[0]))


# ---- one score as a sum of parts ----

@dataclass
class ScoreDecomposition:
    """score = q_query·k_key·scale, before the mask, as a sum over pairs of parts: matrix[a, b] is what query part
    a and key part b give, and matrix.sum() is the score. The parts are the residual stream's: "embeddings",
    "positions" (learned or sinusoidal), "token types" (BERT), "L3 attn" and "L3 MLP" for every layer before this
    one, and "bias" (the q/k biases and every norm's β on the way). See score_decomposition."""
    layer: int
    head: int
    kv_head: int
    query: int                      # positions in the text
    key: int
    score: float                    # q·k·scale from the pass's own queries and keys
    allowed: bool                   # the mask lets this query read this key (False: the score is masked out)
    matrix: Tensor                  # [n_parts, n_parts] float32, query parts × key parts
    query_labels: list[str]
    key_labels: list[str]
    unrotated_score: float | None = None        # RoPE: q_unrotated·k_unrotated·scale, the score without rotation
    pair_scores: Tensor | None = None           # RoPE: [d_head/2] each frequency pair's part of the score
    unrotated_pair_scores: Tensor | None = None  # RoPE: [d_head/2] the same without rotation
    terms: dict[str, float] | None = None       # learned or sinusoidal positions: "token·token", "token·position",
                                                # "position·token", "position·position" (query·key), summing to score


def through_norm(norm, x: Tensor, parts: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """parts [n, P, d] and bias [P, d] after a norm at its input x [P, d], with the scale frozen (Norm.frozen): the
    scale acts on every part, and β joins the bias."""
    frozen = norm.frozen(x)
    beta = 0.0 if norm.bias is None else norm.bias.float()
    return frozen(parts), frozen(bias) + beta


def residual_parts(stack, rec: dict, layer: int, at: Tensor) -> tuple[list[str], Tensor, Tensor]:
    """What layer `layer`'s attention reads at positions `at` [P], as labels, parts [n, P, d] and a bias [P, d]
    (float32) with attn_in[at] = parts.sum(0) + bias. Pre-LN: resid_pre = embeddings + Σ_{l<layer} (attn_out_l +
    mlp_out_l) and the attention norm frozen on top. Post-LN (eqs. 5.1, 5.2): each part passes every later norm,
    each frozen at its own input on this text."""
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
    for l in range(layer):
        block = stack.blocks[l]
        for sublayer, label, norm, before in (("attn_out", "attn", block.attn_norm, "resid_pre"),
                                              ("mlp_out", "MLP", block.ffn_norm, "mlp_in")):
            labels.append(f"L{l} {label}")
            parts = torch.cat([parts, pick(sublayer, l)[None]])                         # [n + 1, P, d]
            if not block.pre_norm:   # norm(x + f(x)): x is resid_pre for attention, mlp_in for the MLP
                parts, bias = through_norm(norm, pick(before, l) + pick(sublayer, l), parts, bias)
    block = stack.blocks[layer]
    if block.pre_norm:
        parts, bias = through_norm(block.attn_norm, rec["resid_pre"][layer][at].float(), parts, bias)
    return labels, parts, bias


def pair_sum(v: Tensor) -> Tensor:
    """[..., d_head] → [..., d_head/2]: RoPE rotates dimensions i and i + d_head/2 together (rotate-half)."""
    first, second = v.chunk(2, dim=-1)
    return first + second


def score_decomposition(model, ids: Tensor, layer: int, head: int, query: int, key: int) -> ScoreDecomposition:
    """The attention score of `head` in `layer` from position `query` to position `key` of ids [1, T], as a sum
    over pairs of residual-stream parts: q = Σ_a R_query(part_a·W_Q) + R_query(bias_q) and k likewise (R: RoPE's
    rotation, where the model has it; biases: b_Q, b_K and every norm's β, through W_Q, W_K), so
    score = Σ_ab (q_a·k_b)·scale = matrix.sum(), exact up to float rounding.

    Every norm on the way is frozen at its value on this input (Norm.frozen): the sum is this input's
    linearisation, exact here and not a decomposition that holds for another text. Pre-LN (GPT-2, Llama) reads
    resid_pre through one frozen norm. Post-LN (BERT, Marian's encoder) has norm(x + f(x)) between layers, so
    the residual stream is no plain sum of layer outputs: there each part is what is left of it at this layer
    after every later norm (each frozen at its own input on this text), and the norms' β join "bias". At layer 0
    of BERT that is the embeddings' LayerNorm alone.

    With learned or sinusoidal positions, terms groups the parts into "position" (the positions part) and
    "token" (every other part, the bias included): at layer 0 that is the classic split of (x + p)·W_Q·W_Kᵀ·(x + p)
    into four terms; at later layers "token" also holds what earlier layers wrote, positional or not."""
    ids = check_text(model, ids)
    layer, head = check_head(model, layer, head)
    n = ids.shape[1]
    query = check_index(query, n, "query position", "the text has positions")
    key = check_index(key, n, "key position", "the text has positions")
    stack, kind = model.attention_stack()
    kv, _ = kv_head_of(stack, head)
    scale = head_scale(stack)
    rec, _ = recorded(model, ids, DECOMPOSITION_RECORDS, range(layer + 1))
    at = torch.tensor([query, key], device=model.device)
    with torch.inference_mode():
        labels, parts, bias = residual_parts(stack, rec, layer, at)
        rows = torch.cat([parts, bias[None]])                                           # [n + 1, 2, d]
        w = model.head_weights(layer, kind)
        q_parts = rows[:, 0] @ w.W_Q[head].float()                                      # [n + 1, d_head]
        k_parts = rows[:, 1] @ w.W_K[kv].float()
        if w.b_Q is not None:
            q_parts[-1] += w.b_Q[head].float()
            k_parts[-1] += w.b_K[kv].float()
        rope = model.rope(stack, at[None], True)                                        # cos, sin [1, 1, 2, d_head]
        if rope is not None:
            cos, sin = (t[0, 0].float() for t in rope)
            q_parts, k_parts = rotate(q_parts, cos[0], sin[0]), rotate(k_parts, cos[1], sin[1])
        matrix = (q_parts @ k_parts.T) * scale                                          # [n + 1, n + 1]
        q, k = rec["q"][layer][query, head].float(), rec["k"][layer][key, kv].float()   # [d_head]
        labels = labels + ["bias"]
        result = ScoreDecomposition(layer, head, kv, query, key, (q @ k).item() * scale,
                                    key <= query or not stack.cfg.causal, cpu(matrix), labels, list(labels))
        if rope is not None:
            q_u = rec["q_unrotated"][layer][query, head].float()
            k_u = rec["k_unrotated"][layer][key, kv].float()
            result.unrotated_score = (q_u @ k_u).item() * scale
            result.pair_scores = cpu(pair_sum(q * k) * scale)                           # [d_head/2]
            result.unrotated_pair_scores = cpu(pair_sum(q_u * k_u) * scale)
    if "positions" in labels:
        result.terms = position_terms(result.matrix, labels.index("positions"))
    return result


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
    """The head's queries and keys over the text in one 2-D basis: the top two principal axes of the queries
    and keys stacked and centred together, so a query and a key that lie close also point alike relative to
    the common mean. Scores are dot products, not distances: the plane shows their relative placement."""
    layer: int
    head: int
    kv_head: int
    rotated: bool                   # after RoPE (what attention dots), or before it
    queries: Tensor                 # [T, 2]
    keys: Tensor                    # [T, 2]
    explained: Tensor               # [2] the share of the stacked matrix's variance along each axis
    components: Tensor              # [2, d_head] the axes (each with its largest loading positive)
    mean: Tensor                    # [d_head] the common mean taken off before projecting


def qk_geometry(model, ids: Tensor, layer: int, head: int, rotated: bool = True) -> QKGeometry:
    """One joint PCA of `head`'s queries and its key/value head's keys over ids [1, T] in `layer`: [2T, d_head]
    stacked, centred by their common mean and projected on its top two right singular vectors."""
    ids = check_text(model, ids)
    layer, head = check_head(model, layer, head)
    stack, _ = model.attention_stack()
    kv, _ = kv_head_of(stack, head)
    names = ("q", "k") if rotated else ("q_unrotated", "k_unrotated")
    rec, _ = recorded(model, ids, names, {layer})
    q, k = cpu(rec[names[0]][layer][:, head]), cpu(rec[names[1]][layer][:, kv])        # [T, d_head]
    stacked = torch.cat([q, k])                                                         # [2T, d_head]
    mean = stacked.mean(0)
    centred = stacked - mean
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    axes = vh[:2]                                                                       # [2, d_head]
    sign = axes.gather(1, axes.abs().argmax(1, keepdim=True)).sign()
    axes = axes * torch.where(sign == 0, 1.0, sign)
    coords = centred @ axes.T                                                           # [2T, 2]
    variance = s.pow(2)
    explained = variance[:2] / variance.sum().clamp_min(torch.finfo(variance.dtype).tiny)
    t = q.shape[0]
    return QKGeometry(layer, head, kv, rotated, coords[:t], coords[t:], explained, axes, mean)
