"""Positions: eq. 4.1's sinusoids and their rotation property, RoPE scores of the model's own queries and keys,
and the permutation check (with positions switched off, does shuffling the tokens only shuffle the outputs?).

Self-attention with no position information treats its input as a set: in an encoder, permuting the tokens
permutes every output the same way (permutation equivariance), up to rounding. A causal decoder is different:
its mask lets token i read tokens 0..i only, so the order reaches the outputs through the mask even without
positions. Both are measured on the user's text, and the sentence is built from the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from core.analysis.inspect import learned_positions, queries_keys, rope_frequencies  # the view reads two here
from core.layers import alibi_slopes, apply_rope, relative_bucket, rope_inv_freq, sinusoidal_encoding
from ui.services.checks import UserError, check_choice, check_range
from ui.services.text import as_batch, to_numpy

MAX_PE_POSITIONS = 512
MAX_PE_DIM = 512


# Each figure of the tab checks only the inputs it draws from, so one bad field leaves the other figures.
def check_positions(n_positions) -> int:
    return check_range("Positions n", n_positions, 2, MAX_PE_POSITIONS)


def check_sinusoid_size(n_positions, d_model) -> tuple[int, int]:
    """(n, d) of eq. 4.1: d even, since sin and cos come in pairs."""
    n = check_positions(n_positions)
    d = check_range("Dimensions d", d_model, 2, MAX_PE_DIM)
    if d % 2:
        raise UserError(f"Dimensions d must be even (sin and cos come in pairs), got {d}.")
    return n, d


def check_start(start_position, n: int) -> int:
    """The start position p of the dot-product curve: at least one offset after it (p ≤ n − 2)."""
    return _within_positions("Start position p", start_position, 0, n - 2, n)


def check_offset(offset, n: int) -> int:
    """The offset k of the rotation check: 1 ≤ k ≤ n − 1, so that some p has p + k among the n positions."""
    return _within_positions("Offset k", offset, 1, n - 1, n)


def _within_positions(name: str, value, low: int, high: int, n: int) -> int:
    try:
        return check_range(name, value, low, high)
    except UserError as exc:
        raise UserError(f"{exc} With n = {n} positions, {name.split()[-1]} goes from {low} to {high}.") from None


def sinusoidal(n: int, d: int) -> np.ndarray:
    """Eq. 4.1 as [n, d] float64 (interleaved sin/cos, as the theory writes it)."""
    return sinusoidal_encoding(n, d).double().cpu().numpy()


def pe_shift_check(pe: np.ndarray, d: int, k: int) -> dict:
    """PE(p + k) = R_k · PE(p) for every p, with R_k block-diagonal rotations by ω_i·k (eq. 4.1 property 3).

    Returns the largest |PE(p+k) − R_k PE(p)|, how far R_k is from orthogonal, and the residual of one
    matrix fitted by least squares to all the pairs (PE(p), PE(p+k)): a single linear map serves every p.
    """
    n = pe.shape[0]
    if not 0 < k < n:
        raise UserError(f"The offset k must be between 1 and {n - 1} for n = {n} positions.")
    omega = 1.0 / np.power(10000.0, 2 * np.arange(d // 2) / d)
    rot = np.zeros((d, d))
    for i, w in enumerate(omega):
        c, s = math.cos(w * k), math.sin(w * k)
        # [sin(a+b), cos(a+b)] = [[cos b, sin b], [−sin b, cos b]] · [sin a, cos a]
        rot[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    before, after = pe[: n - k], pe[k:]
    analytic_error = float(np.abs(after - before @ rot.T).max())
    fitted, *_ = np.linalg.lstsq(before, after, rcond=None)  # after ≈ before @ fitted
    fit_error = float(np.abs(after - before @ fitted).max())
    return {
        "k": k,
        "pairs": n - k,
        "analytic_max_error": analytic_error,
        "fit_max_error": fit_error,
        "rotation_orthogonality": float(np.abs(rot @ rot.T - np.eye(d)).max()),
    }


def cosine_similarity(x: np.ndarray) -> np.ndarray:
    unit = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return unit @ unit.T


def position_table(model) -> tuple[np.ndarray | None, int]:
    """The learned position table from the row that position 0 reads ([positions, d]), and that row: OPT reads
    position p at row p + 2, the others at row p. (None, 0) without a learned table."""
    table = learned_positions(model)
    offset = model.config.position_offset
    return (None, 0) if table is None else (to_numpy(table[offset:]), offset)


def layer_rope_frequencies(model, layer: int) -> torch.Tensor | None:
    """θ_i of one layer's RoPE [rotary_dim/2]: a "sliding" layer's own base where the family gives it one (Gemma 3),
    else the model's; None without RoPE (the model's own choice: Transformer.layer_inv_freq)."""
    return model.layer_inv_freq(model.stack, layer)


def score_bias_by_distance(model, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The bias that the stack the views read (model.attention_stack) adds to every layer's scores, per head,
    against the distance i − j from a query back to its key: distances [D] and bias [H, D] float32. ALiBi's is
    −m_h·(i − j); T5's is its learned value for the bucket of j − i. A causal stack sees keys 0..n−1 back; a
    bidirectional one (T5's encoder) also keys up to n−1 ahead, at negative distances."""
    stack = model.attention_stack()[0]
    if stack.score_bias is None:
        raise UserError(f"{model.config.family} adds no bias to its scores: its positions are "
                        f"{model.config.positional}.")
    distances = np.arange(0, n) if stack.cfg.causal else np.arange(-(n - 1), n)
    query = n - 1                                      # keys at query − distance, all at positions ≥ 0
    keys = torch.as_tensor(query - distances, device=model.device)[None]                     # [1, D]
    with torch.inference_mode():
        bias = stack.score_bias(torch.tensor([[query]], device=model.device), keys)          # [1, H, 1, D]
    return distances, to_numpy(bias[0, :, 0].float())


def rope_scores(
    model,
    ids: list[int],
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
    distances: np.ndarray,
    offsets: list[int],
):
    """Score q·k × scale (the model's own factor on QKᵀ, before any soft-cap) of one real query/key pair (the
    layer's own projections, after any QK-norm, before rotation) placed at relative distance Δ, for several absolute
    offsets m: q at position m + Δ, k at position m. RoPE (with this layer's base, on its rotary dims) makes the
    curves equal."""
    cfg = model.config
    q, k = queries_keys(model, as_batch(ids, model.device), layer, rotate=False)  # [1, H, T, hd], [1, H_kv, T, hd]
    kv_head = cfg.kv_head(head)
    q_vec = q[0, head, query_pos].float()
    k_vec = k[0, kv_head, key_pos].float()
    inv_freq = layer_rope_frequencies(model, layer)
    scale = cfg.score_scale
    curves = {}
    for m in offsets:
        q_pos = torch.as_tensor(m + distances, dtype=torch.long, device=q_vec.device)[None]  # [1, D]
        k_pos = torch.full_like(q_pos, m)
        q_rot = apply_rope(q_vec.expand(1, 1, len(distances), -1).contiguous(), q_pos, inv_freq)[0, 0]
        k_rot = apply_rope(k_vec.expand(1, 1, len(distances), -1).contiguous(), k_pos, inv_freq)[0, 0]
        curves[m] = to_numpy((q_rot * k_rot).sum(-1) * scale)
    return curves


# ---------------------------------------------------------------- position as a bias, and partial rotary

BIAS_KINDS = ("alibi", "t5", "rope-partial")
T5_STACKS = ("encoder", "decoder")
MAX_BIAS_DISTANCE = 2048
T5_DEFAULT_BUCKETS, T5_DEFAULT_MAX_DISTANCE = 32, 128    # T5's own defaults (eq. 6.4)
FORMULA_ROTARY_PCT = 0.25                                # GPT-NeoX's rotary_pct, for a model without partial rotary
FORMULA_ROPE_BASE = 10000.0


def check_bias_kind(kind) -> str:
    return check_choice("Kind", kind, BIAS_KINDS)


def check_t5_stack(stack) -> str:
    return check_choice("Stack", stack, T5_STACKS, " (T5's buckets)")


def check_bias_distance(value) -> int:
    return check_range("Max distance", value, 1, MAX_BIAS_DISTANCE)


def _bias_of(score_bias, query: int, keys: np.ndarray, device) -> np.ndarray:
    """A ScoreBias module's bias [H, D] for one query position and keys [D]."""
    with torch.inference_mode():
        bias = score_bias(torch.tensor([[query]], device=device), torch.as_tensor(keys, device=device)[None])
    return to_numpy(bias[0, :, 0].float())                                          # [1, H, 1, D] → [H, D]


def alibi_by_distance(model, max_distance: int) -> dict:
    """ALiBi (eq. 6.3) for distances i − j = 0..max_distance: slopes m_h [H] and bias −m_h·(i − j) [H, D]. The
    model's own ScoreBias where it has ALiBi (own=True), else the formula for its head count."""
    cfg = model.config
    distances = np.arange(0, max_distance + 1)
    if cfg.score_bias == "alibi":
        stack = model.attention_stack()[0]
        slopes = to_numpy(stack.score_bias.slopes.float())
        bias = _bias_of(stack.score_bias, max_distance, max_distance - distances, model.device)
        return {"own": True, "distances": distances, "slopes": slopes, "bias": bias}
    slopes = alibi_slopes(cfg.n_heads).double().numpy()
    return {"own": False, "distances": distances, "slopes": slopes, "bias": -slopes[:, None] * distances[None]}


def t5_by_distance(model, stack: str, max_distance: int) -> dict:
    """T5's buckets (eq. 6.4) for relative distances j − i = −max_distance..max_distance: the encoder's
    (bidirectional) and the decoder's (causal) bucket index [D] each, and, on a T5 model, the chosen stack's learned
    bias per head [H, D] from its own ScoreBias (own=True); otherwise the formula with T5's defaults and no bias."""
    cfg = model.config
    own = cfg.score_bias == "relative"
    n_buckets = cfg.relative_buckets if own else T5_DEFAULT_BUCKETS
    far = cfg.relative_max_distance if own else T5_DEFAULT_MAX_DISTANCE
    relative = np.arange(-max_distance, max_distance + 1)                            # j − i
    delta = torch.as_tensor(relative)
    buckets = {name: relative_bucket(delta, name == "encoder", n_buckets, far).numpy() for name in T5_STACKS}
    out = {"own": own, "relative": relative, "buckets": buckets, "n_buckets": n_buckets, "max_far": far,
           "bias": None}
    if own:
        module = (model.encoder if stack == "encoder" else model.stack).score_bias
        shown = relative if stack == "encoder" else relative[relative <= 0]   # a decoder's later keys are masked
        out["bias_relative"] = shown
        out["bias"] = _bias_of(module, max_distance, max_distance + shown, model.device)  # query at max_distance
    return out


def rope_partial_by_distance(model, max_distance: int) -> dict:
    """Full against partial rotary (eq. 6.2): each dimension's angle per token [d_k] (0 on the dims that pass
    unrotated) and the score q·R(Δ)k of a fixed pair, q = k = (1, …, 1)/√d_k (1 at Δ = 0), for Δ = 0..max_distance.
    The model's own θ_i (inv_freq, rotary_dim) stands for whichever it has; the other is the formula at its base."""
    cfg = model.config
    head_dim, own_freq = cfg.head_dim, rope_frequencies(model)
    base = cfg.rope_theta if own_freq is not None else FORMULA_ROPE_BASE
    partial_dim = 2 * max(1, round(FORMULA_ROTARY_PCT * head_dim / 2))
    full, partial = rope_inv_freq(head_dim, base), rope_inv_freq(partial_dim, base)
    own = None
    if own_freq is not None:
        own_freq = own_freq.float().cpu()
        own = "full" if 2 * len(own_freq) >= head_dim else "partial"
        full, partial = (own_freq, partial) if own == "full" else (full, own_freq)
    distances = np.arange(0, max_distance + 1)
    out = {"own": own, "base": base, "head_dim": head_dim, "distances": distances}
    for name, inv_freq in (("full", full), ("partial", partial)):
        rotary = 2 * len(inv_freq)
        half = inv_freq.double().numpy()
        out[f"{name}_dims"] = rotary
        # rotate-half: dims i and i + r/2 turn by θ_i together; dims r..d_k pass unrotated
        out[f"{name}_angle"] = np.concatenate([half, half, np.zeros(head_dim - rotary)])
        vec = torch.full((1, 1, len(distances), head_dim), head_dim ** -0.5, dtype=torch.float64)
        q = apply_rope(vec, torch.as_tensor(distances)[None], inv_freq.double())         # q at position Δ
        k = apply_rope(vec, torch.zeros(1, len(distances), dtype=torch.long), inv_freq.double())  # k at position 0
        out[f"{name}_score"] = (q * k).sum(-1)[0, 0].numpy()                              # [D]
    return out


# ---------------------------------------------------------------- the permutation check

EQUIVARIANT_TOLERANCE = 1e-4  # relative to the outputs' scale: float32 rounding stays far below, order effects far above
PERMUTATION_TOKENS = 256
SEED = 0


@dataclass
class PermutationCheck:
    n_tokens: int
    causal: bool
    max_error: float  # max |f(Px) − P f(x)| over tokens and dimensions, final hidden states
    scale: float  # max |f(x)|: the size of the outputs, to read the error against
    mean_error: float
    first_moved: int  # the permuted position of the first token that moved

    @property
    def relative(self) -> float:
        return self.max_error / self.scale if self.scale > 0 else 0.0

    @property
    def equivariant(self) -> bool:
        return self.relative < EQUIVARIANT_TOLERANCE

    def sentence(self) -> str:
        measured = (f"On {self.n_tokens} tokens of your text, shuffled (seed {SEED}), with positions switched off: "
                    f"the outputs of the shuffled text differ from the shuffled outputs by at most "
                    f"{self.max_error:.1e} (the outputs reach {self.scale:.1f}, so {self.relative:.1e} of their size).")
        if self.equivariant and not self.causal:
            why = ("That is rounding: this encoder lets every token attend to every other, so without positions it "
                   "reads the text as a set of tokens, and shuffling the input only shuffles the output. Order reaches "
                   "it through its positions alone.")
        elif self.equivariant:
            why = ("That is rounding, although this model is causal: on this text its mask did not make the order "
                   "visible (a text of repeated tokens can do that).")
        elif self.causal:
            why = ("That is far above rounding: this model is a causal decoder, and its mask lets each token read only "
                   "the tokens before it, so even with no positions a token's output depends on which tokens came "
                   "first. A decoder sees order through its mask; positions tell it how far back each token is.")
        else:
            why = ("That is far above rounding, for an encoder without positions: something else in this model "
                   "depends on position (token types or a padding mask, for example).")
        return f"{measured} {why}"


def permutation_check(model, ids: list[int], seed: int = SEED) -> PermutationCheck:
    """Run the model on the text and on a shuffled copy, both with positions=False, and compare the final hidden
    states of each token. Keeps the model's own causal mask (a decoder is built with it)."""
    ids = list(ids)[:PERMUTATION_TOKENS]
    if len(ids) < 3:
        raise UserError("The permutation check needs at least 3 tokens of text.")
    if model.config.is_encoder_decoder:
        raise UserError("The permutation check reads decoder-only and encoder-only models; this is an "
                        "encoder-decoder.")
    generator = np.random.default_rng(seed)
    perm = generator.permutation(len(ids))
    if np.array_equal(perm, np.arange(len(ids))):
        perm = np.roll(perm, 1)
    x = as_batch(ids, model.device)
    index = torch.as_tensor(perm, device=x.device)
    with torch.inference_mode():
        out = model(x, positions=False).hidden_states.float()  # [1, T, d]
        shuffled = model(x[:, index], positions=False).hidden_states.float()
    diff = (shuffled - out[:, index]).abs()[0].amax(-1)  # [T] largest change per token
    moved = np.flatnonzero(diff.cpu().numpy() > EQUIVARIANT_TOLERANCE * float(out.abs().max()))
    return PermutationCheck(n_tokens=len(ids), causal=bool(model.config.causal), max_error=float(diff.max()),
                            scale=float(out.abs().max()), mean_error=float(diff.mean()),
                            first_moved=int(moved[0]) if moved.size else -1)
