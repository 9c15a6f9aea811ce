"""The course's lessons on the block and on the encoder-decoder.

`block`: the residual stream and what each sublayer writes into it, measured on the loaded model as the size of
each layer's attention and feed-forward outputs against the residual they are added to; and, on two fresh Lab
models (core.lab.train), how the √d scale of the embeddings shrinks a Pre-LN block's first updates.

`encoder-decoder`: cross-attention (eq. 5.7) read live from a small encoder-decoder the project's Lab trained to
reverse letters (assets/lessons/encoder-decoder, made by the command in its README.md): the models the app loads
from the store have no cross-attention, or none trained on a task whose pattern is known.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from core.lab import train as lab
from ui.services.checks import UserError
from ui.services.lab import saved as shipped
from ui.services.lab.residual import first_update_shares, median_ratio
from ui.services.learn import Lesson, Measured, ProgressFn, Question
from ui.services.text import as_batch, encode, to_numpy

# ---------------------------------------------------------------- the block

BLOCK_SAMPLE = "The old lighthouse keeper climbed the stairs every night to light the lamp for the passing ships."
MAX_TOKENS = 32
ASKED_LAYER = 0      # the question's layer: the first, where the residual is still the embedding alone
INIT_LAB = {"task": "reverse", "family": "marian", "norm": "pre"}   # the Lab's layout whose Pre-LN run can stall


def residual_records(model, ids: list[int]) -> dict[str, list[torch.Tensor]]:
    """resid_pre, attn_out, mlp_in, mlp_out of every layer of the stack that reads the text, each [T, d] float32."""
    names = ("resid_pre", "attn_out", "mlp_in", "mlp_out")
    kind = model.attention_stack()[1]
    prefix = "encoder." if kind == "encoder" else ""
    with torch.inference_mode():
        records = model(as_batch(ids, model.device), record=[prefix + n for n in names], return_logits=False).records
    return {n: [t[0].float() for t in records[prefix + n]] for n in names}


def sublayer_shares(model, ids: list[int]) -> dict[str, np.ndarray]:
    """Per layer, the median over tokens of each sublayer's output as a % of the residual stream it joins:
    attention against the block's input; the FFN against what it is added to: resid_pre + attn_out in a Pre-LN
    block (eq. 5.5), its own input norm(x + attn) in a Post-LN one (eq. 5.2), the block's input in a parallel one.
    Also the median norm of the residual entering each FFN, and of its output."""
    cfg = model.attention_stack()[0].cfg
    r = residual_records(model, ids)
    attn, mlp, resid, out = [], [], [], []
    for layer, x in enumerate(r["resid_pre"]):
        if cfg.parallel_block:
            joined = x
        elif cfg.norm_placement == "pre":
            joined = x + r["attn_out"][layer]
        else:
            joined = r["mlp_in"][layer]
        attn.append(median_ratio(r["attn_out"][layer], x))
        mlp.append(median_ratio(r["mlp_out"][layer], joined))
        resid.append(float(joined.norm(dim=-1).median()))
        out.append(float(r["mlp_out"][layer].norm(dim=-1).median()))
    return {"attn": np.array(attn), "mlp": np.array(mlp), "resid_norm": np.array(resid), "mlp_norm": np.array(out)}


@functools.lru_cache(maxsize=1)
def initial_shares() -> dict[str, float]:
    """A fresh Lab model (Marian layout with Pre-LN, the Lab's other defaults, seed 0), with and without the √d scale
    of the token embeddings: the median over held-out tokens of the encoder's first attention output as a % of
    the residual it joins (ui/services/lab/residual.py, which the Lab's comparison reads too). Seeded; cached."""
    return first_update_shares(lab.LabConfig(**INIT_LAB))


def settled_from(shares: np.ndarray) -> int:
    """The first layer from which every later FFN output is smaller than its residual (len(shares) if none)."""
    layer = len(shares)
    while layer > 0 and shares[layer - 1] < 100:
        layer -= 1
    return layer


def measure_block(model, progress: ProgressFn | None = None) -> Measured:
    ids = encode(model, BLOCK_SAMPLE, MAX_TOKENS).ids
    if progress is not None:
        progress(0.1, "one pass, recording each sublayer's output")
    shares = sublayer_shares(model, ids)
    mlp, attn = shares["mlp"], shares["attn"]
    asked = float(mlp[ASKED_LAYER])
    settled = settled_from(mlp)
    if progress is not None:
        progress(0.7, "two fresh Lab models, with and without the √d embedding scale")
    init = initial_shares()
    answer_text = (f"At layer {ASKED_LAYER} the feed-forward network's output is {asked:,.0f} % of the residual it is "
                   f"added to (the median over the text's {len(ids)} tokens; attention's is "
                   f"{attn[ASKED_LAYER]:,.0f} %). Over all {len(mlp)} layers the FFN's share runs from "
                   f"{mlp.min():,.0f} % to {mlp.max():,.0f} %.")
    answer_text += (f"\n\nWhy Pre-LN can stall where Post-LN learns: in a fresh Lab model (its encoder-decoder, Pre-LN, "
                    f"d = {init['d_model']}) the first attention output is {init['with']:.1f} % of the residual when "
                    f"the token embeddings are scaled by √d, and {init['without']:.1f} % without that scale. Pre-LN "
                    "adds every update to that residual as it is, so each first update is that much smaller against "
                    "the stream; Post-LN normalises after each sum, so the scale no longer counts after the first "
                    "sublayer.")
    if asked >= 100:
        verdict = (f"the residual holds only the token's embedding and one attention output (median norm "
                   f"{shares['resid_norm'][ASKED_LAYER]:.3g}) and the FFN writes a vector of norm "
                   f"{shares['mlp_norm'][ASKED_LAYER]:.3g} onto it: this layer rebuilds the token's vector rather "
                   "than adding a correction")
    else:
        verdict = "even in the first layer the FFN's update is smaller than the residual it joins"
    if 0 < settled < len(mlp):
        rest = mlp[settled:]
        verdict += (f"; from layer {settled} on its share stays at or below {rest.max():,.0f} % (median "
                    f"{np.median(rest):,.0f} %), where “a correction” is fair")
    elif settled == 0:
        verdict += f"; in every layer it stays at or below {mlp.max():,.0f} %"
    why = f"At layer {ASKED_LAYER} {verdict}."
    alt = (f"The FFN's output as a share of the residual, per layer (median over {len(ids)} tokens): "
           f"{asked:,.0f} % at layer {ASKED_LAYER}, {np.median(mlp):,.0f} % at the median layer; attention's: "
           f"{np.median(attn):,.0f} % at the median layer.")
    values = {"layers": np.arange(len(mlp)), "attn": attn, "mlp": mlp, "init": init, "n_tokens": len(ids),
              "asked_layer": ASKED_LAYER}
    return Measured(answer=asked, answer_text=answer_text, why=why, alt=alt, values=values,
                    link={"tab": "inside", "layer": ASKED_LAYER, "text": BLOCK_SAMPLE, "show": "inside-stage7"})


BLOCK_TEXT = """Every layer adds to one vector per token, the **residual stream**: the block reads it, computes
something, and adds the result back. Two sublayers do the writing: attention (eq. 3.1), which mixes in the other
tokens, and the position-wise **feed-forward network** (eq. 5.3: two linear maps with a nonlinearity between; SmolLM2
and Llama use the gated SwiGLU, eq. 6.13), which works on each token alone (in the original, 8d² of a layer's 12d²
weights).

Where the **normalisation** sits matters. The original Transformer is **Post-LN** (eqs. 5.1–5.2): add, then
LayerNorm (eq. 5.4), so the stream is renormalised after every sublayer. Most models since are **Pre-LN** (eq. 5.5):
the sublayer reads a normalised copy, x + f(norm(x)), and the stream itself is never normalised until the end.
Many use **RMSNorm** (eq. 5.6), LayerNorm without subtracting the mean.

Textbooks often say each sublayer "adds a small correction" to the stream. Below, the loaded model's attention and
FFN outputs are measured against the residual they join, layer by layer. The Lab's Compare (LayerNorm placement)
shows a related surprise: trained side by side on the same task from the same seed, the Lab encoder-decoder's Pre-LN run
can fail to learn in the steps where Post-LN learns, and the same Pre-LN run learns once its embeddings are no
longer scaled by √d. The answer measures why, on two fresh Lab models."""


# ---------------------------------------------------------------- the encoder-decoder

ASSET = shipped.SAVED_RUNS[shipped.REVERSE]   # the Lab's saved run: the Lab's Run list opens it too
SOURCE = "mirrortarget"   # a source the Lab holds out of training (core.lab.train.held_out)
DIAGONAL, ANTI, ENDS, EVEN = ("the diagonal: output i reads source letter i",
                              "the anti-diagonal: output i reads source letter n − 1 − i",
                              "the first and last source tokens, whatever the output",
                              "spread evenly over the source")
EVEN_BELOW = 2.0   # a row whose largest weight is under twice the uniform 1/S is spread evenly


@functools.lru_cache(maxsize=1)
def lab_model():
    """The Lab's reversing encoder-decoder, loaded once per process (float32, CPU: 45 k parameters)."""
    from core import load_model

    if not (ASSET / "model.safetensors").is_file():
        raise UserError("The lesson's encoder-decoder is missing (assets/lessons/encoder-decoder): it is made by "
                        "the command in that folder's README.md.")
    return load_model(ASSET, device="cpu")


def pattern_masses(weights: np.ndarray, n: int) -> dict[str, float]:
    """weights [T, S]: the cross-attention of the n output rows that write a letter (row r writes output r) over the
    source's S tokens. The mean weight per row on each candidate pattern, and the rows' mean largest weight."""
    rows = weights[:n]
    r = np.arange(n)
    return {DIAGONAL: float(rows[r, r].mean()), ANTI: float(rows[r, n - 1 - r].mean()),
            ENDS: float((rows[:, 0] + rows[:, -1]).mean()), "peak": float(rows.max(-1).mean()),
            "uniform": 1.0 / weights.shape[1]}


def which_pattern(masses: dict[str, float]) -> str:
    if masses["peak"] < EVEN_BELOW * masses["uniform"]:
        return EVEN
    return max((DIAGONAL, ANTI, ENDS), key=masses.get)


def measure_encoder_decoder(model, progress: ProgressFn | None = None) -> Measured:
    if not lab.held_out(SOURCE):
        raise UserError(f"The lesson's source {SOURCE!r} is one the Lab trains on; it needs a held-out one.")
    if progress is not None:
        progress(0.1, "loading the Lab's reversing encoder-decoder")
    reverser = lab_model()
    maps = lab.lab_attention(reverser, "marian", SOURCE)          # its own greedy answer, every map
    target = "".join(maps.target_tokens[1:])
    n = min(len(target), len(SOURCE))
    cross = to_numpy(maps.cross.mean(1))                          # [L, T, S], mean over heads
    per_layer = [pattern_masses(c, n)[ANTI] for c in cross]
    masses = pattern_masses(cross[-1], n)
    answer = which_pattern(masses)
    peaks = lab.alignment(maps, lambda i: len(SOURCE) - 1 - i)
    last = len(cross) - 1
    answer_text = (f"The last layer's cross-attention (layer {last}, the mean of its heads) puts {100 * masses[ANTI]:.0f} % "
                   f"of each output's weight on the mirrored source letter, against {100 * masses[DIAGONAL]:.0f} % on "
                   f"the same place and {100 * masses['uniform']:.0f} % for an even spread; its peak is on the mirrored "
                   f"letter for {100 * peaks:.0f} % of the outputs. The model read “{SOURCE}” and wrote “{target}”"
                   f"{'' if target == SOURCE[::-1] else ' (not the exact reverse)'}. Per layer, weight on the "
                   f"anti-diagonal: " + ", ".join(f"layer {i} {100 * m:.0f} %" for i, m in enumerate(per_layer)) + ".")
    why = (f"To write output letter i the decoder needs source letter n − 1 − i, and cross-attention (eq. 5.7) is the "
           f"only path from the encoder's output to the decoder, so the trained queries point there: "
           f"{100 * masses[ANTI]:.0f} % of the weight, {masses[ANTI] / masses['uniform']:.1f} times an even share.")
    alt = (f"Cross-attention of the Lab's reversing model on “{SOURCE}”, layer {last}, mean of heads: "
           f"{100 * masses[ANTI]:.0f} % of the weight on the anti-diagonal.")
    note = ("This is the Lab's model, not the loaded one: a small encoder-decoder trained by the project's Lab to "
            f"reverse letters, the run the Lab lists as “{shipped.REVERSE}”. ")
    if model.encoder is None:
        note += (f"The loaded model ({model.config.family}) has no cross-attention: it is "
                 f"{'a decoder, whose prompt and answer share one sequence' if model.config.causal else 'an encoder alone'}.")
    else:
        note += "The loaded model has cross-attention too, but no task whose pattern is known in advance."
    values = {"weights": cross[-1], "source": maps.source_tokens, "target": maps.target_tokens, "layer": last,
              "anti_by_layer": per_layer, "masses": masses}
    return Measured(answer=answer, answer_text=answer_text, why=why, alt=alt, values=values,
                    link={"tab": "lab", "settings": {"lab_run": shipped.REVERSE, "source": SOURCE}, "show": "lab-cross"},
                    note=note)


ENCODER_DECODER_TEXT = """The original Transformer has two stacks. The **encoder** reads the whole source at once,
every token attending to every other (no mask). The **decoder** writes the output one token at a time: its
self-attention is causal (eq. 2.3), and each of its layers has a third sublayer, **cross-attention** (eq. 5.7), whose
queries come from the decoder and whose keys and values come from the encoder's output. That is the only place where
the output reads the source.

Decoder-only models (GPT-2, Llama, SmolLM2) drop the encoder: prompt and answer are one sequence, read by causal
self-attention. Encoder-only models (BERT) drop the decoder. Neither has cross-attention, so this lesson reads a
small encoder-decoder that the project's Lab trained to **reverse** a string of letters, on a string it never saw
in training."""


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="block",
        title="The block: residual stream, LayerNorm and the feed-forward network",
        text=BLOCK_TEXT,
        question=Question(
            prompt=(f"In layer {ASKED_LAYER} of this model, how large is the feed-forward network's output compared "
                    "with the residual stream it is added to (the median over the text's tokens)?"),
            unit="% of the residual"),
        measure=measure_block,
        text_sample=BLOCK_SAMPLE,
    ),
    Lesson(
        name="encoder-decoder",
        title="Encoder, decoder and cross-attention",
        text=ENCODER_DECODER_TEXT,
        question=Question(
            prompt=("A model reverses letters: “abcd” → “dcba”. Which pattern does its cross-attention show, output "
                    "letters (rows) against source letters (columns)?"),
            choices=(DIAGONAL, ANTI, ENDS, EVEN)),
        measure=measure_encoder_decoder,
        text_sample=SOURCE,
    ),
)
