"""The permutation check of the Positional encoding tab: with positions switched off, does shuffling the tokens
only shuffle the outputs?

Self-attention with no position information treats its input as a set: in an encoder, permuting the tokens
permutes every output the same way (permutation equivariance), up to rounding. A causal decoder is different: its
mask lets token i read tokens 0..i only, so the order reaches the outputs through the mask even without
positions. Both are measured here on the user's text, and the sentence is built from the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ui.service import UserError, as_batch

EQUIVARIANT_TOLERANCE = 1e-4  # relative to the outputs' scale: float32 rounding stays far below, order effects far above
MAX_TOKENS = 256
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
    ids = list(ids)[:MAX_TOKENS]
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
