"""One forward pass, stage by stage, as plain values over core.analysis.anatomy: the stages of one head and its
layer on a short text, the numbers worth noticing at each, the next-token distribution under temperature, top-k
and top-p (core.generate's own filters), the attention terms this family's layer has in words, and why the head
attends where it does; the online softmax of one row, and the shipped measurement of its memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.analysis import anatomy, inspect, qk
from core.plane import DEFINITION as PLANE_DEFINITION
from core.attention import attention_stages, masked_softmax_, online_softmax, row_entropy, soft_cap, softmax_bytes
from core.generate import filter_top_k, filter_top_p
from ui.services.checks import UserError, check_choice, check_float, check_head, check_range
from ui.services.checks import stack_shape as shape_of  # the Inside tab's fields read the same stack
from ui.services.generation import MAX_TEMPERATURE
from ui.services.text import Encoded, as_batch, encode, to_numpy

MAX_INSIDE_TOKENS = 32   # every stage is drawn as a matrix over the tokens
SHOWN_NEXT = 10          # bars of the next-token distribution


def parameter_counts(model) -> dict:
    """The model's parameters by part (core.analysis.inspect): embeddings, attention, feed_forward, norms, lm_head,
    total, and per_layer {attention, feed_forward}; what the model card sets against 4d² and 8d²."""
    return inspect.parameter_counts(model)


def stack_config(model):
    """The config of the stack the walk reads: the model's own, or a seq2seq model's encoder's."""
    return model.attention_stack()[0].cfg


def encode_walk(model, text) -> Encoded:
    return encode(model, text, MAX_INSIDE_TOKENS)


def check_token(tokens: Encoded, value, field: str = "Token to follow") -> int:
    """A position in the text; −1 is the last token."""
    n = len(tokens.ids)
    index = check_range(field, value, -1, n - 1)
    return n - 1 if index == -1 else index


def walk(model, tokens: Encoded, layer, head) -> anatomy.ForwardStages:
    layer, head = check_head(model, layer, head)
    return anatomy.forward_stages(model, as_batch(tokens.ids, model.device), layer, head)


def scale_words(cfg, scale: float) -> str:
    """The factor on q·k in words: 1/√d_k, the family's own, or none."""
    if cfg.attn_scale is None:
        if not cfg.scale_attention:
            return "none (1: trained without it)"
        return f"1/√d_k = 1/√{cfg.head_dim} = {scale:.4g}"
    if scale == 1:
        return "none (1): this family trains its weights without 1/√d_k"
    return f"{scale:.4g}, the family's own, not 1/√d_k = {cfg.head_dim ** -0.5:.4g}"


def layer_terms(cfg, stages: anatomy.ForwardStages) -> list[str]:
    """What this layer's attention and block have, one phrase a term, in the order the pass uses them (the walk
    names each). cfg: the stack's config (stack_config)."""
    words = [f"scale {scale_words(cfg, stages.scale)}"]
    if cfg.qk_norm:
        words.append("QK-norm: an RMSNorm over d_head on each head's q and k, before RoPE")
    if stages.rope_angles is not None:
        rotated = 2 * stages.rope_angles.shape[-1]
        part = (f"on the first {rotated} of {cfg.head_dim} dims of q and k (partial rotary; the other "
                f"{cfg.head_dim - rotated} pass unrotated)" if rotated < cfg.head_dim else "on q and k")
        if cfg.local_rope(stages.layer):
            part += f", with this sliding layer's own base {cfg.layer_rope_theta(stages.layer):g} (full layers: " \
                    f"{cfg.rope_theta:g})"
        words.append(f"RoPE {part}")
    if stages.softcap is not None:
        words.append(f"a soft-cap c·tanh(S/c) on the scaled scores, c = {stages.softcap:g}")
    if stages.bias_kind == "alibi":
        slope = -float(stages.bias[1, 0]) if stages.bias.shape[0] > 1 else None
        words.append("ALiBi: a position bias −m_h·(i − j) added to the scores" +
                     (f", m = {slope:.4g} for this head" if slope is not None else ""))
    elif stages.bias_kind == "relative":
        words.append("T5's relative-position bias: a learned value per head and bucket of the distance j − i, "
                     "added to the scores")
    words.append("a causal mask" if cfg.causal else "no causal mask (every token reads every token)")
    if stages.window is not None:
        words.append(f"a sliding window: this layer masks keys {stages.window} or more positions back "
                     f"(i − j ≥ {stages.window})")
    elif cfg.sliding_window is not None and "sliding" in cfg.layer_types:
        words.append("no window on this layer (a full layer; the sliding layers have one)")
    if cfg.parallel_block:
        words.append("a parallel block: attention and the MLP both read the block's input, "
                     "x + attn(norm₁(x)) + mlp(norm₂(x))")
    if cfg.sandwich_norm:
        words.append("sandwich norms: each sublayer's output is normed again before it joins the residual stream")
    if cfg.norm_offset:
        words.append(f"norms scale by ({cfg.norm_offset:g} + γ)")
    return words


@dataclass
class Measures:
    """What the walkthrough's notes quote, measured on this text."""
    qk_variance: float            # variance of q·k over the allowed cells
    scaled_variance: float        # the same after the scale
    d_head: int
    entropy: float                # mean attention entropy of the head's rows, nats
    entropy_unscaled: float       # the same without the scale (the cap and the bias kept)
    attn_share: float             # ‖attn_out‖ / ‖resid_pre‖ at the followed token
    mlp_share: float              # ‖mlp_out‖ / ‖mlp_in's residual‖ at the followed token
    norm_scale: float             # the attention norm's 1/s at the followed token
    gate_closed: float | None     # the share of SwiGLU gate values with |act(gate)| < 0.05 (gated FFNs)


def entropy_of(scores: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean row entropy (nats) of softmax(S + M): the core's masked softmax on a copy of the scores."""
    return float(row_entropy(masked_softmax_(scores.float().clone(), mask)).mean())


def measures(stages: anatomy.ForwardStages, token: int) -> Measures:
    scores, mask = stages.scores, stages.mask
    unscaled = soft_cap(scores, stages.softcap) + (0 if stages.bias is None else stages.bias)
    allowed = scores[mask]
    resid_mid = stages.resid_pre + stages.attn_out
    gate = stages.mlp_gate
    return Measures(
        qk_variance=float(allowed.var()) if allowed.numel() > 1 else 0.0,
        scaled_variance=float((allowed * stages.scale).var()) if allowed.numel() > 1 else 0.0,
        d_head=stages.q.shape[-1],
        entropy=entropy_of(stages.scored, mask), entropy_unscaled=entropy_of(unscaled, mask),
        attn_share=float(stages.attn_out[token].norm() / stages.resid_pre[token].norm().clamp_min(1e-12)),
        mlp_share=float(stages.mlp_out[token].norm() / resid_mid[token].norm().clamp_min(1e-12)),
        norm_scale=float(stages.norm_scale[token]),
        gate_closed=None if gate is None else float((gate.abs() < 0.05).float().mean()))


@dataclass
class NextToken:
    ids: list[int]                # the SHOWN_NEXT most likely after temperature
    probs: np.ndarray             # their probabilities after temperature (before the cut)
    kept: np.ndarray              # bool: left by top-k and top-p
    kept_mass: float              # the probability (after temperature) that top-k and top-p leave
    kept_count: int
    temperature: float


def next_token(model, stages: anatomy.ForwardStages, token: int, temperature, top_k, top_p) -> NextToken | None:
    """The next-token distribution at `token` under temperature, then what top-k and top-p keep (None without
    logits). Temperature 0 is greedy: the top token alone."""
    if stages.logits is None:
        return None
    temperature = check_float("Temperature", temperature, 0.0, MAX_TEMPERATURE)
    vocab = stages.logits.shape[-1]
    top_k = None if top_k in (None, "", 0) else check_range("Top-k", top_k, 0, vocab) or None
    top_p = check_float("Top-p", top_p, 0.0, 1.0, low_open=True)
    logits = stages.logits[token].float()
    if temperature == 0:
        kept = torch.zeros(vocab, dtype=torch.bool)
        kept[logits.argmax()] = True
        probs = torch.softmax(logits, -1)
    else:
        scaled = logits / temperature
        probs = torch.softmax(scaled, -1)
        filtered = scaled
        if top_k is not None:
            filtered = filter_top_k(filtered, top_k)
        if top_p < 1:
            filtered = filter_top_p(filtered, top_p)
        kept = torch.isfinite(filtered)
    order = probs.topk(min(SHOWN_NEXT, vocab)).indices
    return NextToken(order.tolist(), to_numpy(probs[order]), kept[order].numpy(), float(probs[kept].sum()),
                     int(kept.sum()), temperature)


SPLITS = {"layers": "layer", "heads": "head"}   # the page's words → core.analysis.qk's `by`


def anatomy_of(model, tokens: Encoded, layer, head, query, key, split: str = "layers",
               relative: bool = False) -> qk.QKAttribution:
    """The score from `query` to `key` split into its parts by qk.qk_attribution: each earlier layer's attention as
    one part ("layers", its score_decomposition) or its heads one by one ("heads"); relative: the score against the
    query's attention-weighted mean score, what says why this key wins (qk_attribution's relative form)."""
    layer, head = check_head(model, layer, head)
    query, key = check_token(tokens, query, "Query"), check_token(tokens, key, "Key")
    split = check_choice("Split the score by", split, tuple(SPLITS))
    if not isinstance(relative, bool):
        raise UserError(f"Against the query's mean key: {relative!r} is not a yes or no")
    ids = as_batch(tokens.ids, model.device)
    try:
        return qk.qk_attribution(model, ids, layer, head, query, key, by=SPLITS[split], relative=relative)
    except ValueError as error:   # a family the split is not exact for says so in words
        raise UserError(str(error)) from None


SIDE_TOP = 8   # parts named on each side of a split by heads; the others are summed into "rest"


def sides_of(result) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(query-side parts, key-side parts) of a split: each side's sums of the matrix, largest |value| first,
    SIDE_TOP named and the rest summed (qk.ranked); each side adds up to the score."""
    return (qk.ranked(result.query_labels, result.matrix.sum(1), SIDE_TOP),
            qk.ranked(result.key_labels, result.matrix.sum(0), SIDE_TOP))


def content_and_position(model, tokens: Encoded, stages: anatomy.ForwardStages, query: int) -> dict[str, np.ndarray]:
    """Every key's scaled score from one query, and what of it is content and what position: for RoPE, the score
    with the rotation removed beside the real one (before the cap, where the family soft-caps: the cap is no
    sum); for a score bias (ALiBi, T5), q·k·scale beside the bias; for added positions, the token·token part
    (from the decomposition, one per key) beside the score."""
    keys = len(tokens.ids) if bool(stages.mask[query, query + 1:].any()) else query + 1   # a causal mask: ≤ query
    scale = stages.scale
    score = to_numpy(stages.scores[query, :keys] * scale)
    if stages.rope_angles is not None:
        q_alone, k_alone = stages.q_unrotated[query:query + 1], stages.k_unrotated[:keys]   # [1, d], [keys, d]
        unrotated = to_numpy(attention_stages(q_alone, k_alone, None, scale)[0][0])
        name = "the score before the cap (after RoPE)" if stages.softcap is not None else "the score (after RoPE)"
        return {name: score, "without the rotation (content alone)": unrotated,
                "what the rotation adds (position)": score - unrotated}
    if stages.bias is not None:
        return {"the score (q·k·scale + bias)": to_numpy(stages.scored[query, :keys]),
                "q·k·scale (content)": score, "the bias (position)": to_numpy(stages.bias[query, :keys])}
    if stages.positions is None:
        return {"the score": score}
    ids = as_batch(tokens.ids, model.device)
    content = np.array([qk.score_decomposition(model, ids, stages.layer, stages.head, query, k).terms["token·token"]
                        for k in range(keys)])
    return {"the score": score, "token·token part (content)": content, "the parts with positions": score - content}


def geometry(model, tokens: Encoded, layer, head) -> anatomy.QKGeometry:
    """The head's queries and keys in the one query/key plane (PLANE_DEFINITION), the corpus view's too."""
    layer, head = check_head(model, layer, head)
    return anatomy.qk_geometry(model, as_batch(tokens.ids, model.device), layer, head)


def stage_arrays(stages: anatomy.ForwardStages) -> dict[str, np.ndarray]:
    """Every stage as numpy, for the .npz export (stages the model does not have are left out)."""
    out = {}
    for name in anatomy.STAGES:
        value = getattr(stages, name)
        if value is not None:
            out[name] = value.numpy() if value.dtype in (torch.bool, torch.long) else to_numpy(value)
    return out


# ---- the online softmax of one row (eq. 6.10), FlashAttention's way of reading the keys ----

ONLINE_LENGTHS = (512, 1024, 2048, 4096, 8192)   # the lengths the bytes table counts
MAX_BLOCK = 8192

# The online softmax's peak memory as bench/variants/online_softmax.py measured and shipped it: the Inside tab and
# the cost lesson read these figures with the date, the machine, the command and the method beside them; nothing
# is measured at request time. softmax_bytes (core/attention.py) is the formula, tested against this measurement.
MEASURED = Path(__file__).resolve().parents[2] / "assets" / "measured" / "online_softmax.json"
BENCH = "bench/variants/online_softmax.py"      # writes MEASURED with --publish
MOVING = "online, moving threshold"              # its column of the online method under glibc's default allocator


@dataclass(frozen=True)
class MemoryRow:
    n: int          # tokens (queries = keys)
    plain: float    # median bytes one call added to the peak RSS: softmax(q·kᵀ·s)·v with its n × n matrices
    online: float   # core.attention.online_attention, a block of keys at a time
    fused: float    # torch's scaled_dot_product_attention, the core's fast path
    online_default: float | None   # online again under glibc's default (moving) mmap threshold, which keeps blocks


@dataclass(frozen=True)
class SoftmaxMemory:
    date: str
    machine: str
    command: str
    method: str      # how a peak was read (the kernel's VmHWM, ...)
    allocator: str   # the C allocator's setting the three ran under
    block: int
    d_head: int
    threads: int
    repeats: int
    rows: tuple[MemoryRow, ...]


def online_softmax_memory(path: Path = MEASURED) -> SoftmaxMemory | None:
    """The shipped measurement, or None where it was never made; a damaged file is an error that names it."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        rows = tuple(MemoryRow(int(r["n"]), *(float(r[m]["median"]) for m in ("plain", "online", "fused")),
                               float(r[MOVING]["median"]) if MOVING in r else None) for r in raw["rows"])
        return SoftmaxMemory(str(raw["date"]), str(raw["machine"]), str(raw["command"]), str(raw["method"]),
                             str(raw["allocator"]), int(raw["block"]), int(raw["d_head"]), int(raw["threads"]),
                             int(raw["repeats"]), rows)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not the measurement {BENCH} --publish writes ({type(err).__name__}: {err}); "
                         f"run that command again to remake it") from err


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2 ** 20:,.1f} MiB"


# how a peak was read, in a lesson's words: the measurement's own method and allocator lines name kernel counters
# and allocator settings, which the Inside tab states beside its command and a student need not read
LESSON_METHOD = "what one call added to the most memory its process held, each call in a fresh process"


def measured_source(memory: SoftmaxMemory, command: bool = True) -> str:
    """Where the figures come from, in words: the method, the allocator, the sizes and settings, the date, the
    machine and (command) the command, as the measurement wrote them. A lesson (command False) leaves out the
    command and the method's implementation terms: a student reads the page, not the repository."""
    sizes = f"{memory.rows[0].n:,}–{memory.rows[-1].n:,}" if len(memory.rows) > 1 else f"{memory.rows[0].n:,}"
    how = f"{memory.method}, median of {memory.repeats}; {memory.allocator}" if command else \
        f"{LESSON_METHOD}, median of {memory.repeats}"
    return (f"{how}; {sizes} tokens, one head (d_head "
            f"{memory.d_head}, float32, blocks of {memory.block} keys), {memory.threads} "
            f"thread{'s' if memory.threads != 1 else ''}; {memory.date}, {memory.machine}"
            + (f"; `{memory.command}`" if command else ""))


def measured_sentence(memory: SoftmaxMemory, command: bool = True) -> str:
    """The largest size's peaks and the ratio, then where they come from."""
    top = memory.rows[-1]
    allocator = "glibc's default allocator" if command else "the memory allocator's default setting"
    default = (f"; {mib(top.online_default)} under {allocator}, which keeps some freed blocks"
               if top.online_default is not None else "")
    return (f"at {top.n:,} tokens the plain softmax added {mib(top.plain)} to the peak memory, the online one "
            f"{mib(top.online)} ({top.plain / top.online:,.1f}× less{default}) and torch's fused kernel "
            f"{mib(top.fused)} ({measured_source(memory, command)}).")



@dataclass
class OnlineRow:
    """One query row of the walked head, its softmax read a block of keys at a time (core.attention.online_softmax)
    beside the pass's own weights."""
    layer: int
    head: int
    query: int
    block: int
    scores: np.ndarray          # [n] what the softmax reads: scored, −inf where the mask hides a key
    plain: np.ndarray           # [n] the pass's own weights (stage probs), softmax of the scores
    online: np.ndarray          # [n] e^(s_j − m)/ℓ with the last block's m and ℓ
    starts: np.ndarray          # [blocks] each block's first key; stops: one past its last
    stops: np.ndarray
    block_max: np.ndarray       # [blocks] the block's own max (−inf where it masks every key)
    running_max: np.ndarray     # [blocks] m after the block
    rescale: np.ndarray         # [blocks] e^(m_old − m_new) applied to ℓ and the output before the block adds
    running_sum: np.ndarray     # [blocks] ℓ after the block
    probs_difference: float     # max_j |online − plain|
    output_difference: float    # max |Σ_j p_j v_j read online − the pass's z row|
    d_head: int
    bytes: list[tuple[int, int, int]]   # the formula: (n, plain bytes, online bytes) for n in ONLINE_LENGTHS, this
                                        # block and d_head (core.attention.softmax_bytes, counted from the shapes)
    measured: SoftmaxMemory | None      # the shipped measurement (bench/variants/online_softmax.py), or None


def online_row(model, tokens: Encoded, layer, head, query, block) -> OnlineRow:
    """The walked head's softmax of one query row, read a block of keys at a time with the running max and sum,
    and its output accumulated the same way, each against the pass's own numbers."""
    block = check_range("Block size", block, 1, MAX_BLOCK)
    stages = walk(model, tokens, layer, head)
    query = check_token(tokens, query)
    row = stages.scored[query].double().masked_fill(~stages.mask[query], float("-inf"))   # [n]
    probs, steps, out = online_softmax(row, block, stages.v.double())
    plain = stages.probs[query].double()
    return OnlineRow(
        layer=stages.layer, head=stages.head, query=query, block=block,
        scores=row.numpy(), plain=plain.numpy(), online=probs.numpy(),
        starts=np.array([s.start for s in steps]), stops=np.array([s.stop for s in steps]),
        block_max=np.array([s.block_max for s in steps]), running_max=np.array([s.m for s in steps]),
        rescale=np.array([s.rescale for s in steps]), running_sum=np.array([s.ell for s in steps]),
        probs_difference=float((probs - plain).abs().max()),
        output_difference=float((out - stages.z[query].double()).abs().max()),
        d_head=stages.v.shape[-1],
        bytes=[(n, *softmax_bytes(n, n, block, stages.v.shape[-1]).values()) for n in ONLINE_LENGTHS],
        measured=online_softmax_memory())
