"""What an approximation of attention (core.approx) costs one text, in accuracy: each head's error against exact
attention on the same queries, keys and values (Approx(shadow=True): every approximated layer reads the exact
stream), and the whole model's change with the approximation flowing through every chosen layer: the text's
perplexity (a decoder: the mean next-token loss, exponentiated) or, for a model that reads the text both ways (an
encoder, or a seq2seq model's encoder), the cosine between its sentence embeddings with and without it (the mean of
the last hidden states over the tokens, as sentence-transformers pools MiniLM). With it, the bytes the KV cache
holds per token.

An approximation a saved corpus job names is written in words (its arguments are JSON values, not objects):
approx_words(Approx("topk", k=32, layers=[3])) == "topk k=32 layers=3", read back by approx_from_words.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..approx import METHODS, Approx
from ..corpus.jobs import check_ids, one_text
from ..logits import losses


@dataclass
class ApproxResult:
    """One text under one approximation. tv and z_error are [layers, heads] of the stack that reads the text, NaN
    where a head is not approximated; tv is None for a method without a weight per key (linformer)."""
    approx: Approx
    tokens: int                     # the text's length, every token read (nothing cut)
    tv: Tensor | None               # mean over query rows of ½Σ_j|p̂_ij − p_ij|, in [0, 1]
    z_error: Tensor                 # ‖ẑ − z‖ / ‖z‖ of each head's output over the text, ≥ 0
    measure: str                    # "perplexity" (a decoder) or "cosine" (an encoder's sentence embedding)
    exact: float                    # the measure with exact attention (the cosine's is 1)
    approximate: float              # the measure with the approximation flowing through
    cache_bytes_exact: int          # bytes per token the KV cache holds, exact (the model's own dtype)
    cache_bytes_approx: int         # under the approximation

    @property
    def change(self) -> float:
        """Perplexity: its relative change, approximate / exact − 1; cosine: 1 − cos (0: the embedding unchanged)."""
        return self.approximate / self.exact - 1 if self.measure == "perplexity" else 1 - self.approximate


def reads_forwards(model) -> bool:
    """Whether the model predicts each next token of the text itself (a decoder-only LM): then perplexity is its
    measure; else the sentence embedding's cosine."""
    return model.config.causal and model.encoder is None and model.lm_head is not None


def sentence_embedding(hidden: Tensor) -> Tensor:
    """[1, T, d] → [d] float32, the mean over the tokens (sentence-transformers' mean pooling)."""
    return hidden[0].float().mean(0)


def approximation(model, ids, approx: Approx) -> ApproxResult:
    """Each head's error under `approx` and the model's change on one text (token ids [T] or [1, T], all read)."""
    if not isinstance(approx, Approx):
        raise ValueError(f"approx must be a core.approx.Approx, got {type(approx).__name__}")
    ids = check_ids(model, one_text(ids)[0], "ids")[None].to(model.device)
    forwards = reads_forwards(model)
    if forwards and ids.shape[1] < 2:
        raise ValueError("a perplexity needs at least two tokens")
    stack, _ = model.attention_stack()
    cfg = stack.cfg
    with torch.inference_mode():
        shadow = model(ids, approx=approx.shadowing(True), return_logits=False)
        exact_hidden = shadow.hidden_states if forwards or model.encoder is None else shadow.encoder_hidden_states
        replaced = model(ids, approx=approx.shadowing(False), return_logits=False)
        approx_hidden = replaced.hidden_states if forwards or model.encoder is None else replaced.encoder_hidden_states
        if forwards:
            targets = ids[:, 1:]
            exact = math.exp(losses(model, exact_hidden[:, :-1], targets).mean().item())
            approximate = math.exp(losses(model, approx_hidden[:, :-1], targets).mean().item())
        else:
            exact = 1.0
            approximate = torch.nn.functional.cosine_similarity(sentence_embedding(exact_hidden),
                                                                sentence_embedding(approx_hidden), dim=0).item()
    n_layers, n_heads = len(stack.blocks), cfg.n_heads
    tv = None if not approx.has_weights else torch.full((n_layers, n_heads), float("nan"))
    z_error = torch.full((n_layers, n_heads), float("nan"))
    chosen = torch.ones(n_heads, dtype=torch.bool) if approx.heads is None else approx.head_mask(n_heads, "cpu")
    for layer, (layer_tv, layer_z) in shadow.approx_errors.items():
        z_error[layer, chosen] = layer_z[0].float().cpu()[chosen]
        if tv is not None and layer_tv is not None:
            tv[layer, chosen] = layer_tv[0].float().cpu()[chosen]
    size = torch.finfo(model.dtype).bits // 8
    full = Approx("topk")       # every key kept: the exact cache
    return ApproxResult(approx, ids.shape[1], tv, z_error, "perplexity" if forwards else "cosine", exact, approximate,
                        full.cache_bytes_per_token(cfg, size), approx.cache_bytes_per_token(cfg, size))


def approx_words(approx: Approx) -> str:
    """An Approx as the words a saved job keeps: the method, every budget term (defaults written out, so the same
    approximation has one spelling), then layers= and heads= where chosen: "bigbird block=16 global_blocks=1
    random_blocks=2 seed=0 layers=15". A fitted linformer is refused: its projections are tensors."""
    if not isinstance(approx, Approx):
        raise ValueError(f"approx must be a core.approx.Approx, got {type(approx).__name__}")
    if approx.projections is not None:
        raise ValueError("a fitted linformer carries its projections (tensors from core.approx.fit_linformer), which "
                         "words cannot hold: pass the Approx itself to approximation_over")
    terms = [approx.method, *(f"{key}={value}" for key, value in approx.budget.items())]
    for name, chosen in (("layers", approx.layers), ("heads", approx.heads)):
        if chosen is not None:
            terms.append(f"{name}={','.join(map(str, chosen))}")
    return " ".join(terms)


def approx_from_words(words: str) -> Approx:
    """The Approx that approx_words wrote: "METHOD [term=value ...] [layers=a,b] [heads=a,b]", whole numbers but for
    linformer's fit ("random"; a fitted one needs its projections, so it is refused here)."""
    if not isinstance(words, str) or not words.split():
        raise ValueError(f"an approximation in words is a method and its terms, e.g. 'topk k=32 layers=3'; "
                         f"got {words!r}")
    method, *terms = words.split()
    if method not in METHODS:
        raise ValueError(f"unknown approximation {method!r}: choose one of {', '.join(METHODS)}")
    budget, chosen = {}, {}
    for term in terms:
        key, equals, value = term.partition("=")
        if not equals or not key or not value:
            raise ValueError(f"{term!r} is not a term: write name=value, e.g. k=32 or layers=3,4")
        if key in budget or key in chosen:
            raise ValueError(f"{key} is given twice in {words!r}")
        if key in ("layers", "heads"):
            chosen[key] = [whole(key, part) for part in value.split(",")]
        elif key == "fit":
            if value == "fitted":
                raise ValueError("linformer fit=fitted needs its projections (core.approx.fit_linformer), which "
                                 "words cannot hold: pass the Approx itself to approximation_over")
            budget[key] = value
        else:
            budget[key] = whole(key, value)
    return Approx(method, chosen.get("layers"), chosen.get("heads"), **budget)


def whole(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be a whole number (or numbers, a,b for layers and heads), got {value!r}") \
            from None
