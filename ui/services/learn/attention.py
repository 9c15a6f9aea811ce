"""The course's first part: attention itself (eqs. 2.1–2.4 and 3.1), five lessons measured on the loaded model.

why-attention: one pass over a text against the same text read one token at a time (core.generate's prefill and decode
steps with a KV cache), timed, and the Lab's saved GRU beside attention (ui.services.lab.recurrence).
queries-keys-values: one head's scores QKᵀ on a short text. sqrt-dk: the variance of q·k on that head before and after
the scale, beside random unit-variance vectors. masks: what the causal and padding masks hold back
(ui.services.masks). heads: one layer's W^Q, W^K, W^V, W^O counted from the weights, and the previous-token and
induction heads found on the seeded repeated probe.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import torch

from core.analysis import anatomy, heads
from core.attention import attention_stages
from core.generate import (
    decode_step,
    device_clock,
    encoder_context,
    one_sequence,
    prefill,
)
from ui.services.checks import stack_shape
from ui.services.heads import (
    INDUCTION_LENGTH,
    INDUCTION_SEED,
    next_token_reason,
    top_heads,
)
from ui.services.inside import entropy_of, measures
from ui.services.lab import recurrence
from ui.services.learn import Lesson, Measured, ProgressFn, Question, generate_link
from ui.services.masks import causal_effect, padding_effect, viewed_attentions
from ui.services.text import as_batch, encode, to_numpy

READ_TEXT = "When the storm finally passed, she climbed the stairs and lit the lamp again."
HEAD_TEXT = "The keeper lit the lamp, and the lamp lit the bay."  # the Inside tab's text
MASK_TEXT = ("Every morning the baker opens the shop at six. The first customers buy warm bread, and by noon the "
             "shelves are almost empty.")
PAD_LONG, PAD_SHORT = "The river flows past the old mill and into the quiet valley below.", "Rain again today."
MAX_READ_TOKENS = 32   # the text read one token at a time: a step per token, timed TIMING_RUNS times
TIMING_RUNS = 3        # each way of reading is timed this often; the medians are compared
HEAD = (3, 2)          # the head of the score lessons (layer, head), the last one where a model has fewer
RANDOM_ROWS = 256      # random unit-variance q and k: 256 × 256 dot products for the textbook's variance
RANDOM_SEED = 0


def report(progress: ProgressFn | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(fraction, message)


def percent(share: float) -> str:
    return f"{100 * share:.1f} %"


# ---- why-attention: one pass against one token at a time ----

def read_at_once(model, ids: list[int], context: dict) -> tuple[float, torch.Tensor | None]:
    """Seconds of one pass over every token (a prefill, no cache), and the last position's logits."""
    clock = device_clock(model)
    with torch.inference_mode():
        started = clock()
        if model.lm_head is None:   # an encoder without an LM head: its hidden states are the output
            model(as_batch(ids, model.device), return_logits=False)
            return clock() - started, None
        logits = prefill(model, one_sequence(ids, model.device), None, None, **context)
        return clock() - started, logits[0].float()


def read_step_by_step(model, ids: list[int], context: dict) -> tuple[float, torch.Tensor]:
    """Seconds to read the tokens one at a time, as a recurrent network must: the first token's prefill, then one
    decode step per token, each reading the keys and values of the earlier ones from the KV cache. Returns the
    time and the last position's logits (the same as one pass computes: the causal mask makes them equal)."""
    clock = device_clock(model)
    with torch.inference_mode():
        cache = model.new_cache(1, len(ids))
        started = clock()
        logits = prefill(model, one_sequence(ids[:1], model.device), None, cache, **context)
        for token in ids[1:]:
            logits = decode_step(model, one_sequence([token], model.device), cache, None, **context)
            cache.advance(1)
        return clock() - started, logits[0].float()


def read_prefixes(model, ids: list[int]) -> tuple[float, None]:
    """An encoder read left to right: every new token changes the outputs of the tokens before it (it reads both
    ways), so nothing can be cached and each step runs the whole prefix again; the seconds of all T passes."""
    clock = device_clock(model)
    with torch.inference_mode():
        started = clock()
        for end in range(1, len(ids) + 1):
            model(as_batch(ids[:end], model.device), return_logits=False)
        return clock() - started, None


def measure_reading(model, progress: ProgressFn | None = None) -> Measured:
    cfg = model.config
    ids = encode(model, READ_TEXT, MAX_READ_TOKENS).ids
    encoder_only = not cfg.causal and model.encoder is None
    decoder_ids, context, note = ids, {}, ""
    if model.encoder is not None:   # the decoder reads the text as its target, after the encoder read it once
        context = encoder_context(model, ids)
        decoder_ids = ([cfg.decoder_start_token_id] + ids)[:len(ids)]
        note = (f"The loaded model ({cfg.family}) is an encoder-decoder: its decoder reads the text here, with the "
                "encoder's reading of the same text computed once beforehand (not timed).")
    if encoder_only:
        note = (f"The loaded model ({cfg.family}) is an encoder: it reads every token in both directions, so a "
                "left-to-right reading cannot keep a cache; here each step runs the whole prefix again, the cost such "
                "a reader would pay.")
    read_at_once(model, decoder_ids[:2], context)   # untimed: the first call of a process pays for set-up
    at_once, one_by_one, logits = [], [], None
    for run in range(TIMING_RUNS):
        report(progress, run / TIMING_RUNS, f"timing run {run + 1} of {TIMING_RUNS}")
        seconds, logits = read_at_once(model, decoder_ids, context)
        at_once.append(seconds)
        seconds, stepped = (read_prefixes(model, decoder_ids) if encoder_only
                            else read_step_by_step(model, decoder_ids, context))
        one_by_one.append(seconds)
    ratio = statistics.median(one_by_one) / max(statistics.median(at_once), 1e-9)
    ratios = [b / max(a, 1e-9) for a, b in zip(at_once, one_by_one)]
    n = len(decoder_ids)
    same = None if encoder_only or logits is None else float((logits - stepped).abs().max())
    agree = ("" if same is None else
             f" Both ways give the same last-token logits (max |Δ| = {same:.1e}): the causal mask makes a token's "
             "output depend only on the tokens before it, so the order of the work does not change the result.")
    return Measured(
        answer=ratio,
        answer_text=(f"Reading the {n} tokens in one pass took {1e3 * statistics.median(at_once):.0f} ms, one token at "
                     f"a time {1e3 * statistics.median(one_by_one):.0f} ms (medians of {TIMING_RUNS} runs): one pass "
                     f"is {ratio:.1f}× faster. The runs gave {', '.join(f'{r:.1f}×' for r in ratios)}: timings vary "
                     "from run to run with what else the machine is doing." + agree),
        why=(f"One pass multiplies a {n} × {cfg.d_model} matrix by each weight matrix once, while {n} steps each "
             f"multiply a 1 × {cfg.d_model} row, reading every weight {n} times; a recurrent network has no choice, "
             "since step t needs the state of step t − 1. " + recurrence.lesson_words()),
        alt=(f"{n} tokens: one pass {1e3 * statistics.median(at_once):.0f} ms, one at a time "
             f"{1e3 * statistics.median(one_by_one):.0f} ms, {ratio:.1f}× (median of {TIMING_RUNS} runs)."),
        values={"tokens": n, "at_once": at_once, "one_by_one": one_by_one, "ratios": ratios, "ratio": ratio,
                "max_logit_diff": same, "encoder_only": encoder_only, "recurrence": recurrence.lesson_values()},
        link=generate_link(model, READ_TEXT, "gen-step-row"), note=note)


# ---- queries-keys-values and sqrt-dk: one head on a short text ----

def lesson_head(model) -> tuple[int, int]:
    """HEAD, or the last layer and head of a model that has fewer (the stack the views read)."""
    n_layers, n_heads = stack_shape(model)
    return min(HEAD[0], n_layers - 1), min(HEAD[1], n_heads - 1)


def head_stages(model, text: str) -> tuple[anatomy.ForwardStages, list[str]]:
    """The lesson head's stages of eq. 2.1 on `text` (core.analysis.anatomy) and the tokens' labels."""
    layer, head = lesson_head(model)
    tokens = encode(model, text, 64)
    return anatomy.forward_stages(model, as_batch(tokens.ids, model.device), layer, head), tokens.labels


KEY_KINDS = ("itself", "the token just before it", "the first token", "an earlier token with the same text",
             "another earlier token")


def key_kind(ids: list[int], query: int, key: int) -> str:
    """Which of KEY_KINDS key `key` is to query `query` (the first that fits, in that order)."""
    if key == query:
        return KEY_KINDS[0]
    if key == query - 1:
        return KEY_KINDS[1]
    if key == 0:
        return KEY_KINDS[2]
    return KEY_KINDS[3] if ids[key] == ids[query] else KEY_KINDS[4]


def measure_scores(model, progress: ProgressFn | None = None) -> Measured:
    report(progress, 0.0, "one pass, recording the head's queries and keys")
    stages, labels = head_stages(model, HEAD_TEXT)
    ids = stages.tokens.tolist()
    scores = to_numpy(stages.scores)                                       # [T, T]: S = QKᵀ, before the scale
    mask = stages.mask.numpy()
    last = len(ids) - 1
    row = np.where(mask[last], scores[last], -np.inf)
    key = int(row.argmax())
    kind = key_kind(ids, last, key)
    weight = float(stages.probs[last, key])
    seen = scores[last][mask[last]]
    pieces = [label.split(" ", 1)[1] for label in labels]                 # labels read "position token"
    name = pieces[key]
    best = np.where(mask, scores, -np.inf).argmax(-1)[1:]                # each later query's top key
    sink = int((best == 0).sum())
    note = "" if (~mask).any() else (f"This model's head reads both ways (no causal mask): all {mask.size} cells "
                                     "of the figure are filled, each query scored against the keys after it too.")
    return Measured(
        answer=kind,
        answer_text=(f"In layer {stages.layer}, head {stages.head}, the last token's query (“{pieces[last]}”) "
                     f"scores highest against key {key}, “{name}”: q·k = {row[key]:.1f}, in a row that runs from "
                     f"{seen.min():.1f} to {seen.max():.1f}. After the scale and the softmax that key gets "
                     f"{percent(weight)} of the token's attention."),
        why=(f"A score is only a dot product q_i·k_j of two {stages.q.shape[1]}-wide vectors the head computed from "
             f"the tokens (eq. 2.1); this head gives the first token a key that {sink} of the {len(ids) - 1} later "
             "queries match best, a common resting place (a sink) for a head with nothing to read." if key == 0 else
             f"A score is only a dot product q_i·k_j of two {stages.q.shape[1]}-wide vectors the head computed from "
             "the tokens (eq. 2.1): the key that points most the query's way wins, whatever its meaning."),
        alt=(f"Layer {stages.layer}, head {stages.head}: QKᵀ over {len(ids)} tokens; the last query's highest score "
             f"is {row[key]:.1f}, on “{name}” (position {key})."),
        values={"scores": np.where(mask, scores, np.nan), "labels": labels, "layer": stages.layer,
                "head": stages.head, "kv_head": stages.kv_head, "key": key, "weight": weight,
                "d_head": int(stages.q.shape[1])},
        link={"tab": "inside", "layer": stages.layer, "head": stages.head, "text": HEAD_TEXT, "show": "inside-stage5"},
        note=note,
    )


def random_unit_scores(rows: int, d_head: int, seed: int = RANDOM_SEED) -> torch.Tensor:
    """q·k/√d_k [rows, rows] for q and k drawn independently from N(0, 1) in every component: eq. 2.2's setting."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(rows, d_head, generator=gen), torch.randn(rows, d_head, generator=gen)
    return attention_stages(q, k, None, d_head ** -0.5)[0]   # the core's S = QKᵀ·scale, nothing masked


def measure_scale(model, progress: ProgressFn | None = None) -> Measured:
    report(progress, 0.0, "one pass, recording the head's queries and keys")
    stages, _ = head_stages(model, HEAD_TEXT)
    found = measures(stages, len(stages.tokens) - 1)
    d_k, scale = int(stages.q.shape[1]), stages.scale
    var_q, var_k = float(stages.q.var()), float(stages.k.var())
    independent = d_k * var_q * var_k * scale ** 2        # eq. 2.2 with component variances σ_q², σ_k² instead of 1
    random_scores = random_unit_scores(RANDOM_ROWS, d_k)
    n = len(stages.tokens)
    random_mask = stages.mask
    random_entropy = (entropy_of(random_scores[:n, :n], random_mask),
                      entropy_of(random_scores[:n, :n] * math.sqrt(d_k), random_mask))
    random_var = float(random_scores.var())
    textbook = abs(scale - d_k ** -0.5) < 1e-9
    factor = f"1/√{d_k}" if textbook else f"this family's own {scale:.4g} (1/√d_k would be {d_k ** -0.5:.4g})"
    return Measured(
        answer=found.scaled_variance,
        answer_text=(f"Layer {stages.layer}, head {stages.head}: Var(q·k) over the {int(stages.mask.sum())} pairs the "
                     f"mask allows is {found.qk_variance:.1f} before the scale and {found.scaled_variance:.2f} after "
                     f"multiplying by {factor}. Random q and k with unit-variance components give "
                     f"{random_var:.2f}, the textbook's 1. The scale keeps the softmax soft: this head's mean row "
                     f"entropy is {found.entropy:.2f} nats with it and {found.entropy_unscaled:.2f} without."),
        why=(f"Eq. 2.2 assumes components of variance 1, but this head's q components have variance {var_q:.2f} "
             f"and its k components {var_k:.2f}: independent vectors of those variances would give "
             f"d_k·σ_q²·σ_k²·scale² = {independent:.2f}; the rest comes from q and k being neither independent nor "
             "centred (training aligns them), so the scale removes the growth with d_k but does not bring a real "
             "head to 1."),
        alt=(f"Var(q·k) after the scale: {found.scaled_variance:.2f} on layer {stages.layer}, head {stages.head} "
             f"(d_k = {d_k}), against {random_var:.2f} for random unit-variance q and k."),
        values={"layer": stages.layer, "head": stages.head, "d_head": d_k, "scale": scale,
                "raw_variance": found.qk_variance, "scaled_variance": found.scaled_variance, "var_q": var_q,
                "var_k": var_k, "independent": independent, "random_variance": random_var,
                "random_raw_variance": random_var * d_k, "entropy": (found.entropy, found.entropy_unscaled),
                "random_entropy": random_entropy},
        link={"tab": "inside", "layer": stages.layer, "head": stages.head, "text": HEAD_TEXT, "show": "inside-stage5"},
    )


# ---- masks ----

def later_share(attentions: list[torch.Tensor]) -> list[float]:
    """Per layer, the weight each query puts on the keys after it, mean over heads and every query but the last
    (which has none after it); attentions: [1, H, T, T] per layer."""
    n = attentions[0].shape[-1]
    later = torch.ones(n, n, dtype=torch.bool).triu(1)
    return [float((a[0].float().cpu() * later).sum(-1)[:, :-1].mean()) for a in attentions]


def measure_masks(model, progress: ProgressFn | None = None) -> Measured:
    cfg = model.config
    ids = encode(model, MASK_TEXT, 64).ids
    decoder_only = cfg.causal and model.encoder is None
    report(progress, 0.0, "one pass without the causal mask" if decoder_only else "one pass")
    with torch.inference_mode():
        out = model(as_batch(ids, model.device), causal_mask=not decoder_only, capture_attention=True,
                    return_logits=False)
    shares = later_share(viewed_attentions(model, out))
    share = float(np.mean(shares))
    report(progress, 0.4, "next-token loss with and without the causal mask")
    effect = causal_effect(model, ids) if decoder_only else None
    report(progress, 0.7, "two texts batched with padding, the padding mask on and off")
    padded = padding_effect(model, encode(model, PAD_LONG).ids, encode(model, PAD_SHORT).ids) \
        if model.encoder is None else None
    if decoder_only:
        what = (f"Without the causal mask (eq. 2.3) a token of this text puts {percent(share)} of its attention on "
                "the tokens after it, mean over every layer and head.")
    else:
        stack = "its encoder" if model.encoder is not None else "it"
        what = (f"The loaded model ({cfg.family}) is "
                f"{'an encoder-decoder' if model.encoder is not None else 'an encoder'}: "
                f"{stack} has no causal mask and reads both ways, so a token puts {percent(share)} of its "
                "attention on the tokens after it, mean over every layer and head.")
    if effect is not None:
        (loss_on, loss_off), (acc_on, acc_off) = effect["loss"], effect["accuracy"]
        why = (f"With the mask, next-token accuracy is {percent(acc_on)} (loss {loss_on:.2f} nats); without it "
               f"{percent(acc_off)} (loss {loss_off:.2f}), because each position can now read the very token it "
               "must predict: a model trained that way learns to copy and fails when generating, where no future "
               "exists.")
    else:
        why = ("An encoder fills in or encodes a text it sees whole, so it needs no causal mask; what it does need is "
               "the padding mask, when texts of different lengths share a batch.")
    pad_words, note, shown = "", "", "mask-causal" if decoder_only or padded is None else "mask-padding"
    if padded is not None:
        on, off = padded["results"]["padding mask on"], padded["results"]["padding mask off"]
        pad_words = (f" Batched with a longer text, the short one gets {padded['n_pad']} pad tokens on the "
                     f"{padded['side']}; without the padding mask (eq. 2.4) its tokens put "
                     f"{percent(float(np.mean(off['pad_mass'])))} of their attention on them and their outputs move "
                     f"by up to {off['max_change']:.2f} (relative), against {on['max_change']:.1e} with it.")
    else:
        note = (f"The loaded model ({cfg.family}) is an encoder-decoder: the padding demo batches texts for "
                "decoder-only and encoder-only models, so it is left out here.")
    return Measured(
        answer=100 * share,
        answer_text=what + pad_words,
        why=why,
        alt=(f"Weight on later tokens {'without the causal mask' if decoder_only else '(no causal mask)'}: "
             f"{percent(share)} mean over {len(shares)} layers"
             + (f"; on padding without its mask: {percent(float(np.mean(off['pad_mass'])))}." if padded else ".")),
        values={"later_share": shares, "share": share, "decoder_only": decoder_only,
                "pad_share": None if padded is None else padded["results"]["padding mask off"]["pad_mass"],
                "pad_share_masked": None if padded is None else padded["results"]["padding mask on"]["pad_mass"],
                "causal": effect, "padding": padded},
        link={"tab": "masks", "text": MASK_TEXT, "layer": int(np.argmax(shares)), "head": 0, "show": shown},
        note=note,
    )


# ---- heads: 4d² counted, and what heads do ----

def attention_weights(model, layer: int) -> dict[str, int]:
    """The self-attention parameters of `layer` (the stack the views read), counted from the model's state_dict:
    W^Q, W^K, W^V (split from the fused qkv rows by the config's heads: H·d_k, H_kv·d_k, H_kv·d_k), W^O, and
    what else the layer has (biases, the q and k norms)."""
    cfg = model.attention_stack()[0].cfg
    prefix = f"{'encoder' if model.encoder is not None else 'stack'}.blocks.{layer}.attn."
    own = {name[len(prefix):]: t for name, t in model.state_dict().items() if name.startswith(prefix)}
    qkv, d_k = own.pop("qkv.weight"), cfg.head_dim
    rows = (cfg.n_heads * d_k, cfg.n_kv_heads * d_k, cfg.n_kv_heads * d_k)
    if qkv.shape[0] != sum(rows):
        raise ValueError(f"layer {layer}'s qkv weight has {qkv.shape[0]} rows; the config's heads give {sum(rows)}")
    counts = {name: size * qkv.shape[1] for name, size in zip(("W^Q", "W^K", "W^V"), rows)}
    counts["W^O"] = own.pop("out.weight").numel()
    counts["biases and norms"] = sum(t.numel() for t in own.values())
    return counts


def found_heads(model) -> dict:
    """The previous-token and induction scores [L, H] on the seeded repeated probe (the Heads tab's: core's
    induction probe), with the strongest head of each; no induction where the model predicts no next token."""
    reason = next_token_reason(model, "The induction score")
    length = min(INDUCTION_LENGTH, (model.attention_stack()[0].cfg.max_positions - 1) // 2)  # twice, after a BOS
    if reason is None:
        probe = heads.induction(model, length, INDUCTION_SEED)
        ids, induction, losses = probe.ids, probe.scores, (probe.loss_first, probe.loss_second)
    else:
        tok = model.tokenizer
        ids = heads.induction_probe(model.config.vocab_size, length, INDUCTION_SEED,
                                    avoid=tuple(tok.all_special_ids) if tok is not None else ())
        induction, losses = None, None
    previous = heads.pattern_scores(model, ids)["previous_token"]
    tok = model.tokenizer
    # the probe as text, for "try it": the Heads tab then shows the head on what it was found on (a text that
    # repeats), not on a text with nothing to copy
    text = tok.decode(ids[0].tolist(), skip_special_tokens=True) if tok is not None else ""
    return {"previous": previous, "induction": induction, "losses": losses, "reason": reason, "text": text,
            "top_previous": top_heads(previous, "previous_token", 1)[0],
            "top_induction": None if induction is None else top_heads(induction, "induction", 1)[0],
            "tokens": ids.shape[1]}


def measure_heads(model, progress: ProgressFn | None = None) -> Measured:
    stack_cfg = model.attention_stack()[0].cfg
    d, h, h_kv, d_k = stack_cfg.d_model, stack_cfg.n_heads, stack_cfg.n_kv_heads, stack_cfg.head_dim
    counts = attention_weights(model, 0)
    per_layer = [sum(attention_weights(model, layer).values()) for layer in range(stack_cfg.n_layers)]
    total = per_layer[0]
    weights = sum(counts[name] for name in ("W^Q", "W^K", "W^V", "W^O"))
    report(progress, 0.2, "the induction probe: random tokens, then the same again")
    found = found_heads(model)
    layer, head, score = found["top_induction"] or found["top_previous"]
    p_layer, p_head, p_score = found["top_previous"]
    same = all(n == total for n in per_layer)
    gqa = (f"; it has {h} query heads but only {h_kv} key/value heads (grouped-query attention, eq. 6.11), so W^K and "
           f"W^V are {d} × {h_kv * d_k} instead of {d} × {d}" if h_kv < h else "")
    width = (f"; its heads are {d_k} wide, so H·d_k = {h * d_k} ≠ d" if h * d_k != d else "")
    extras = f" plus {counts['biases and norms']:,} in biases and norms" if counts["biases and norms"] else ""
    if found["induction"] is not None:
        first, second = found["losses"]
        heads_words = (f" On {found['tokens']} tokens of seeded random text repeated once, layer {p_layer}, head "
                       f"{p_head} puts {percent(p_score)} of its weight on the previous token, and layer {layer}, head "
                       f"{head} {percent(score)} on the token after the earlier copy of the current one (an induction "
                       f"head): the next-token loss falls from {first:.1f} nats on the first copy to {second:.1f} on "
                       "the second.")
    else:
        heads_words = (f" On {found['tokens']} tokens of seeded random text repeated once, layer {p_layer}, head "
                       f"{p_head} puts {percent(p_score)} of its weight on the previous token. {found['reason']}")
    return Measured(
        answer=float(total),
        answer_text=(f"Layer 0's attention holds {total:,} parameters: W^Q {counts['W^Q']:,}, W^K {counts['W^K']:,}, "
                     f"W^V {counts['W^V']:,}, W^O {counts['W^O']:,}{extras}"
                     + ("; every layer holds the same." if same else "; the layers differ in size.") + heads_words),
        why=(f"4d² = 4 · {d}² = {4 * d * d:,} assumes h heads of width d/h for queries, keys and values alike; "
             + (f"this model's four matrices hold exactly that, {weights:,}: splitting d into {h} heads adds no "
                "weights." if weights == 4 * d * d else
                f"this model's weights hold {weights:,} ({percent(weights / (4 * d * d))} of it){gqa}{width}.")),
        alt=(f"Layer 0: W^Q {counts['W^Q']:,} · W^K {counts['W^K']:,} · W^V {counts['W^V']:,} · W^O "
             f"{counts['W^O']:,} = {weights:,} weights, against 4d² = {4 * d * d:,}"
             + (f"; with {counts['biases and norms']:,} in biases and norms, {total:,} parameters."
                if counts["biases and norms"] else ".")),
        values={"counts": counts, "per_layer": per_layer, "d_model": d, "n_heads": h, "n_kv_heads": h_kv,
                "head_dim": d_k, "four_d_squared": 4 * d * d, "previous": to_numpy(found["previous"]),
                "induction": None if found["induction"] is None else to_numpy(found["induction"]),
                "top_previous": found["top_previous"], "top_induction": found["top_induction"]},
        link={"tab": "heads", "layer": layer, "head": head, **({"text": found["text"]} if found["text"] else {}),
              "settings": {"score": "induction" if found["top_induction"] else "previous_token"}, "show": "heads-map"},
    )


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="why-attention",
        title="Why attention replaced recurrence",
        text=(
            "A recurrent network reads a text the way we do, one token after another: step t cannot start before "
            "step t − 1 has finished, so a long text means a long chain of small steps. Attention (eq. 2.1) lets "
            "every token read every earlier token directly, so a whole text goes through the model in one pass of "
            "large matrix products, which a CPU or a GPU does far better than many small ones.\n\n"
            "Here the loaded model reads the same text twice: in one pass, and one token at a time with a KV cache "
            "(each step computes only the new token's query, key and value and reads the rest from the cache, as "
            "generation does). Both give the same numbers; only the time differs.\n\n" + recurrence.LESSON_TEXT),
        question=Question("How many times faster is reading the text in one pass than reading it one token at a "
                          "time?", unit="×"),
        measure=measure_reading,
        text_sample=READ_TEXT,
    ),
    Lesson(
        name="queries-keys-values",
        title="Queries, keys and values",
        text=(
            "Each token is turned into three vectors by three weight matrices: a query q (what it looks for), a "
            "key k (what it offers to be found by) and a value v (what it passes on when found). The score of "
            "query i against key j is the dot product q_i·k_j; all of them at once are the matrix QKᵀ of eq. 2.1. "
            "After the scale, the mask and a softmax per row, the scores become weights that mix the values.\n\n"
            "The figure shows the raw scores QKᵀ of one head on a short sentence; in a decoder the cells above the "
            "diagonal are blank, hidden by the causal mask (eq. 2.3)."),
        question=Question("Which key does the last token's query score highest?", choices=KEY_KINDS),
        measure=measure_scores,
        text_sample=HEAD_TEXT,
    ),
    Lesson(
        name="sqrt-dk",
        title="Why divide by √d_k",
        text=(
            "If the d_k components of q and k were independent with mean 0 and variance 1, q·k would be a sum of d_k "
            "terms of variance 1, so its variance would be d_k (eq. 2.2): at d_k = 64, scores of size 8, which push "
            "the softmax towards one-hot, where its gradients vanish. Dividing by √d_k brings the variance back to "
            "1 whatever the width.\n\n"
            "A trained head is not random. The lesson measures the variance of q·k on one real head before and after "
            "the scale, the variance of each of q's and k's components, and the same for random unit-variance "
            "vectors, and the softmax's entropy with and without the scale."),
        question=Question("On this head, what is the variance of q·k after dividing by √d_k? (For random "
                          "unit-variance q and k it is 1.)"),
        measure=measure_scale,
        text_sample=HEAD_TEXT,
    ),
    Lesson(
        name="masks",
        title="Softmax and the masks",
        text=(
            "The mask M of eq. 2.1 adds −∞ to the scores a query must not read, so the softmax gives them a weight "
            "of exactly 0. A decoder's causal mask (eq. 2.3) hides every later token: it learns to predict token "
            "t + 1 from tokens 0…t, and at generation time the future does not exist yet. The padding mask "
            "(eq. 2.4) hides the filler added when texts of different lengths share a batch.\n\n"
            "An encoder such as BERT has no causal mask: it reads the whole text both ways. It still needs the "
            "padding mask. The lesson switches each mask off and measures what leaks through."),
        question=Question("Remove the causal mask: what share of its attention does a token then give to the tokens "
                          "after it (mean over every layer and head)?", unit="%"),
        measure=measure_masks,
        text_sample=MASK_TEXT,
    ),
    Lesson(
        name="heads",
        title="Multi-head attention: what heads do",
        text=(
            "Multi-head attention (eq. 3.1) runs h attentions side by side, each on its own d/h-wide slice with its "
            "own W_i^Q, W_i^K, W_i^V, and mixes their outputs with W^O. The heads together hold 3d² weights and "
            "W^O d², 4d² in all: splitting into heads adds no weights. Many recent models share keys and values "
            "between groups of query heads (grouped-query attention, eq. 6.11), which makes W^K and W^V smaller.\n\n"
            "Because each head has its own weights, heads take on jobs. A previous-token head reads the token just "
            "before; an induction head finds the earlier copy of the current token and reads the token that "
            "followed it, which lets the model continue a repeated text. They are found here on random tokens "
            "repeated once, where only looking back can predict the second copy."),
        question=Question("How many parameters does one layer's attention (W^Q, W^K, W^V and W^O) hold in this "
                          "model?"),
        measure=measure_heads,
    ),
)
