"""The course's lesson on positions: self-attention reads a set, so a model needs positions to know the order.

The measurement reads the first attention layer of the loaded model (of the stack that reads the text) as the
model's own pass records it (attn_out, what the attention sublayer adds to the residual stream), on a text and on
the same text shuffled, through the pass's own switches: positions off or on, the causal mask off or on. Every
other term of that layer is the model's own: its scale, QK-norm and soft-cap, and a sliding window where the layer
has one (no switch removes a window, so the text is cut to it: "no mask" then holds). The shuffled outputs, put
back in order, are compared with the original ones. What happens past the trained length is read from the Lab's
saved run (assets/extrapolation, core.lab.extrapolation), which trained one small decoder per kind of position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from core.probe import Probe
from ui.services.lab.extrapolation import SAVED_COMMAND, saved
from ui.services.learn import Lesson, Measured, ProgressFn, Question
from ui.services.text import as_batch, encode

SAMPLE = "The dog chased the cat up the tree, and then the cat watched the dog from a high branch."
LAYER = 0          # the first layer reads the token rows themselves: nothing in its input depends on the order
SEED = 0
MAX_TOKENS = 32
ROUNDING = 1e-4    # a difference below this share of the outputs' size is float rounding (sums in another order)
SLIGHT = 0.05      # below this share: slightly different; above: a different output

SAME, SLIGHTLY, DIFFERENT = ("the same, up to float rounding (about a millionth of their size)",
                             "slightly different (a few percent of their size)",
                             "clearly different (a large share of their size)")
POSITION_WORDS = {"rope": "RoPE", "learned": "a learned position table", "sinusoidal": "added sinusoids",
                  "alibi": "ALiBi", "relative": "T5's buckets"}
EXTRAPOLATION_KINDS = ("sinusoidal", "learned", "rope", "alibi", "none")


@dataclass
class Shuffled:
    """One condition of the check: the largest |f(Px) − P·f(x)| over tokens and dimensions, and max |f(x)|."""

    condition: str
    max_difference: float
    scale: float

    @property
    def relative(self) -> float:
        return self.max_difference / self.scale if self.scale > 0 else 0.0


def positions_of(model) -> str:
    """The kind of position the stack that reads the text uses: rope, learned, sinusoidal, alibi, relative, none."""
    cfg = model.attention_stack()[0].cfg
    return cfg.score_bias if cfg.score_bias in ("alibi", "relative") else cfg.positional


def layer_output(model, ids: list[int], positions: bool, causal: bool) -> torch.Tensor:
    """The first layer's attention output [T, d] (float32) as the model's own pass records it (attn_out: W_O·z + b,
    through the layer's post-norm where it has one), the pass stopped after that layer. positions and causal are
    the pass's switches (core.model.Transformer.run_stack: positions=False leaves out the position rows, RoPE and
    any score bias; causal=False the causal mask); a sliding window of that layer stays."""
    stack, kind = model.attention_stack()
    name = Probe.full_name(kind, "attn_out")
    probe = Probe(model.config, {name}, layers=[LAYER])
    with torch.inference_mode():
        model.run_stack(stack, as_batch(ids, model.device), None, kind=kind, causal=causal, positions=positions,
                        probe=probe, n_layers=LAYER + 1)
    return probe.records[name][LAYER][0].float()                                        # [T, d]


def lesson_tokens(model) -> int:
    """The tokens the lesson reads: MAX_TOKENS, or the first layer's sliding window w where it is shorter. No switch
    of the pass removes a window (it hides keys w or more places back, a mask by distance), so a text of at most w
    tokens is what keeps "no mask" true."""
    window = model.attention_stack()[0].cfg.layer_window(LAYER)
    return MAX_TOKENS if window is None else min(MAX_TOKENS, window)


def shuffle_check(model, ids: list[int], positions: bool, causal: bool, condition: str,
                  seed: int = SEED) -> Shuffled:
    """Run the layer on the text and on the text shuffled (a seeded permutation P), and compare f(Px) with P·f(x)."""
    perm = shuffle_order(len(ids), seed)
    out = layer_output(model, ids, positions, causal)
    shuffled = layer_output(model, [ids[p] for p in perm], positions, causal)
    back = out[torch.as_tensor(perm, device=out.device)]
    return Shuffled(condition, float((shuffled - back).abs().max()), float(out.abs().max()))


def shuffle_order(n: int, seed: int = SEED) -> np.ndarray:
    """A seeded permutation of n places that moves at least one."""
    perm = np.random.default_rng(seed).permutation(n)
    return np.roll(perm, 1) if np.array_equal(perm, np.arange(n)) else perm


def verdict(relative: float) -> str:
    """The question's choice that a relative difference falls in."""
    return SAME if relative < ROUNDING else SLIGHTLY if relative < SLIGHT else DIFFERENT


def extrapolation_words() -> tuple[str, dict]:
    """The Lab's saved run in words, and its accuracies {kind: {symbols: accuracy or None}} (None: refused)."""
    result = saved()
    if result is None:
        missing = (f"The Lab's saved run past the trained length is missing here (it is made by `{SAVED_COMMAND}`), "
                   "so this lesson cannot quote it.")
        return missing, {}
    lengths = result.config.test_lengths
    accuracy = {k.kind: {n: k.accuracy.get(n) for n in lengths} for k in result.kinds}
    parts = []
    for kind in EXTRAPOLATION_KINDS:
        if kind not in accuracy:
            continue
        shown = ", ".join("no row to read" if a is None else f"{100 * a:.1f} %" for a in accuracy[kind].values())
        parts.append(f"{kind}: {shown}")
    trained, longest = result.config.train_longest, max(lengths)
    words = (f"Past the trained length, in the Lab's saved run (a small decoder trained once per kind of position to "
             f"copy up to {trained} symbols, then asked to copy {', '.join(map(str, lengths))}): token accuracy "
             f"{'; '.join(parts)}.")
    read = {kind: by_length[longest] for kind, by_length in accuracy.items() if by_length.get(longest) is not None}
    if read:
        best = max(read, key=read.get)
        words += f" At {longest} symbols {best} keeps the most ({100 * read[best]:.1f} %)"
        whole = max((share for k in result.kinds for n, share in k.exact.items() if n > trained), default=None)
        if whole is not None:
            words += (f"; no kind copied a single text longer than {trained} symbols whole" if whole == 0 else
                      f"; the best share of whole copies past {trained} symbols is {100 * whole:.0f} %")
        words += "."
    return words, accuracy


def shuffle_checks(model, ids: list[int], progress: ProgressFn | None = None) -> list[Shuffled]:
    """The shuffle check under each condition the model has: no positions and no mask first, then its own
    positions (none where it has none), then no positions with its causal mask (a decoder's)."""
    kind = positions_of(model)
    conditions = [("no positions, no mask", False, False)]
    if kind != "none":
        conditions.append((f"its own positions: {POSITION_WORDS.get(kind, kind)}", True, False))
    if model.attention_stack()[0].cfg.causal:
        conditions.append(("no positions, the causal mask", False, True))
    checks = []
    for i, (name, positions, masked) in enumerate(conditions):
        if progress is not None:
            progress(i / len(conditions), f"shuffling the text: {name}")
        checks.append(shuffle_check(model, ids, positions, masked, name))
    return checks


def shuffle_values(checks: list[Shuffled], n_tokens: int) -> dict:
    """What the shuffle figure draws (ui.views.learn.positions.shuffle_chart)."""
    return {"conditions": [c.condition for c in checks], "relative": [c.relative for c in checks],
            "max_difference": [c.max_difference for c in checks], "scale": [c.scale for c in checks],
            "n_tokens": n_tokens, "layer": LAYER}


def measure_positions(model, progress: ProgressFn | None = None) -> Measured:
    encoded = encode(model, SAMPLE, lesson_tokens(model))
    ids = encoded.ids
    kind = positions_of(model)
    own = POSITION_WORDS.get(kind, kind)
    checks = shuffle_checks(model, ids, progress)
    plain = checks[0]
    answer = verdict(plain.relative)
    words, accuracy = extrapolation_words()
    window = model.attention_stack()[0].cfg.layer_window(LAYER)
    cut = ("" if window is None or window >= MAX_TOKENS or not encoded.note else
           f" (cut to layer {LAYER}'s sliding window of {window} tokens, so the window hides no key)")
    answer_text = (f"With no positions, the outputs of the shuffled text{cut}, put back in order, differ from the "
                   f"original outputs by at most {plain.max_difference:.1e} (the outputs reach {plain.scale:.2g}, so "
                   f"{plain.relative:.1e} of their size).")
    for check in checks[1:]:
        if check.condition.startswith("its own"):
            lead = f"With the model's own positions ({own}) they differ by"
        else:
            lead = "With no positions but the causal mask (each token reads only those before it), by"
        answer_text += f" {lead} {check.relative:.1e} of their size: {verdict(check.relative).split(' (')[0]}."
    answer_text += f"\n\n{words}"
    why = (f"Each output of eq. 2.1 is a softmax-weighted sum over the keys, and nothing in a score q·k or in that sum "
           f"says where a key sits, so shuffling the keys only reorders the sum ({plain.relative:.1e} is the "
           f"rounding of adding in another order)")
    if kind != "none":
        why += (f"; with {own} the scores depend on the places, and the difference is {checks[1].relative:.1e} of "
                "the outputs' size.")
    elif model.attention_stack()[0].cfg.causal:
        why += (f"; this model has no positions of its own, and only the causal mask lets the order in "
                f"({checks[1].relative:.1e} of the outputs' size).")
    else:
        why += "; this model has no positions of its own, so only a mask could make the order visible."
    alt = (f"Shuffling {len(ids)} tokens through layer {LAYER}'s attention: with no positions the outputs differ by "
           f"{plain.relative:.1e} of their size; " +
           "; ".join(f"{c.condition}: {c.relative:.1e}" for c in checks[1:]) + ".")
    values = {**shuffle_values(checks, len(ids)), "window": window, "extrapolation": accuracy}
    note = ("The accuracies past the trained length come from the Lab's saved run (its first screen shows it): small "
            "decoders the project trained once per kind of position, not the loaded model.")
    return Measured(answer=answer, answer_text=answer_text, why=why, alt=alt, values=values,
                    link={"tab": "positions", "text": SAMPLE, "show": "pe-shuffle"}, note=note)


TEXT = """Attention (eq. 2.1) scores every pair of tokens by q·k and sums the values with the softmax's weights.
Nothing in that formula says *where* a token stands: shuffle the tokens and, without positions, every output is
the same as before, only shuffled with them. Attention is **permutation equivariant**; on its own it reads a bag
of tokens. (A decoder's causal mask, eq. 2.3, does let some order in: a token sees only those before it.)

Models add the order in one of four ways:

- **sinusoids** (eq. 4.1), added to the token embeddings (eq. 4.2): each position gets a fixed pattern of sines and
  cosines at geometrically spaced frequencies, defined for any position;
- a **learned table** (eq. 4.3): one trained row per position, and no row past the last one it was given;
- **RoPE** (eq. 6.2): q and k are rotated by an angle proportional to their position, so q·k depends on their
  positions only through the distance i − j (SmolLM2 and most recent decoders);
- **ALiBi** (eq. 6.3): no position vectors at all; each head subtracts m_h·(i − j) from the scores, a penalty that
  grows with distance.

Below, one attention layer of the loaded model runs on a text and on the same text shuffled, first with no
positions and no mask, then with the model's own positions; then the Lab's saved run shows what each kind does on
texts longer than any it was trained on."""

LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="positions",
        title="Why attention needs positions",
        text=TEXT,
        question=Question(
            prompt=("Shuffle the tokens of a text and run one attention layer with no positions and no mask. Put the "
                    "outputs back in the original order: how do they compare with the outputs on the original text?"),
            choices=(SAME, SLIGHTLY, DIFFERENT)),
        measure=measure_positions,
        text_sample=SAMPLE,
    ),
)
